"""The library's root exception, and the errors of its public surface that have no other home.

Every error class the library defines derives from `FilterError`, beside the standard base it
always had (a `FenceError` is still a `ValueError`, `FilterClosed` still a `RuntimeError`), so
a caller can catch everything the filter raises with one clause and existing clauses still work.
Imports nothing: any module may derive from it.

The whole tree (each class in the module named, its standard base in brackets):

    FilterError
    ├── ConfigError                  core.config.schema: a config that does not validate
    ├── PubsubNameError [ValueError] core.config.names: a topic or subscription id Pub/Sub refuses
    ├── PathError [ValueError]       core.paths: a field path that does not parse
    ├── PayloadError [ValueError]    core.compare.canonical: a payload the route cannot read
    │   └── MissingField             the entity key is not in the message
    ├── EnvelopeError [ValueError]   core.envelope: a push body that is not a push envelope
    ├── FilterTypeError [TypeError]  a value the library cannot take
    ├── FilterUsageError [RuntimeError]  a call the filter cannot honour where it was made
    ├── UnknownRouteError [ValueError]   a route the config does not define
    ├── ResultNotStored [ValueError] why a body's result is not kept (logged, never raised)
    ├── StoreUnavailable             core.ports: the state store did not answer in time
    │   └── Locked                   backends.stores.sqlite_connection: another process holds the file
    ├── PublishFailed                core.ports: a forward was not published (the message is retried)
    │   ├── Unpublishable            Pub/Sub refuses this message as it is
    │   └── WorkFailed               inprocess.body: the caller's own body raised
    ├── Failure                      core.ports: a foreseeable failure, already worded for the user
    ├── LaneLost [RuntimeError]      core.engine.offload: the large-message process ended mid-step
    ├── InsertFailed                 backends.records.bigquery: decision rows BigQuery refused
    ├── FenceError [ValueError]      consumer.fence: a forwarded message without a readable fence
    ├── FenceContended               consumer.fence: another consumer took the key meanwhile
    ├── FilterClosed [RuntimeError]  inprocess.api: the filter was closed
    ├── Nack                         inprocess.handlers: a handler's way to ask for a redelivery
    ├── AuthError                    push.auth: a push token that does not verify
    │   └── CertsUnavailable         Google's certificates could not be fetched
    ├── PullSetupError               pull.command: a route that cannot be pulled
    ├── ReplayOptionError [ValueError]   replay.options: a bad `replay` option (exit 2)
    ├── ReplayFailure                replay.deadletter: a dead letter that cannot be replayed
    ├── PullFailed                   replay.replayer: the dead-letter pull failed
    ├── ProvisionError               tools.provision: a resource refused or in conflict
    ├── ChartUnavailable             tools.skiprate_chart: matplotlib is not installed
    └── CommandLineError             cli: a bad value on the command line (exit 2)

`tests/unit/test_public_surface.py` holds this tree to the classes the package defines.
"""

from __future__ import annotations


class FilterError(Exception):
    """The root of every error pubsub-filter raises."""


class FilterTypeError(FilterError, TypeError):
    """A value the library cannot take: a message it cannot read as one, a body it cannot run."""


class UnknownRouteError(FilterError, ValueError):
    """A route name that the filter's config does not define."""


class FilterUsageError(FilterError, RuntimeError):
    """A call the filter cannot honour where it was made (closing a filter from inside its own body)."""


class ResultNotStored(FilterError, ValueError):
    """Why a body's result cannot be kept by a `cache_result` route (not JSON-encodable, or too large).

    Not raised to the caller: the body returned, so the forward is committed without its
    result (a redelivery returns `result` None, `cached` False) and the reason is logged, a
    `result_not_kept` warning once a route per filter. Exported as the name of that reason."""
