"""The library's public surface, used as a user would: only names from `pubsub_filter.__all__`.

What `from filter import ...` gives, one root error for everything the library raises, the
same construction for the sync and the async API, and `process` taking what a user holds.
"""

from __future__ import annotations

import ast
import base64
import datetime
import importlib
import inspect
import json
import os
import pkgutil
import queue
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1.types import PubsubMessage

import pubsub_filter as library
from pubsub_filter import (
    FenceError,
    Filter,
    FilterClosed,
    FilterError,
    FilterTypeError,
    Forward,
    Message,
    Nack,
    ResultNotStored,
    SyncFilter,
    UnknownRouteError,
    on_payload,
    payload_message,
)

ROOT = Path(__file__).resolve().parents[2]
ROUTE = "reports"

PUBLIC = {
    # the in-process API, sync and async, and its decorators
    "Filter",
    "SyncFilter",
    "on_payload",
    "on_push",
    "on_cloudevent",
    # what it takes and gives
    "Message",
    "payload_message",
    "Outcome",
    "Forward",
    "Decision",
    "DecisionRecord",
    # the consumer's fence
    "Fences",
    "Admission",
    "SqliteFences",
    "FirestoreFences",
    # errors: one root, and those a caller handles
    "FilterError",
    "FilterTypeError",
    "FilterUsageError",
    "UnknownRouteError",
    "ResultNotStored",
    "FilterClosed",
    "Nack",
    "ConfigError",
    "EnvelopeError",
    "FenceError",
    "FenceContended",
    "StoreUnavailable",
    "PublishFailed",
    "__version__",
}


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "filter.yaml"
    path.write_text(
        f"store: {{backend: sqlite, path: {tmp_path / 'state.db'}}}\n"
        f"records: {{backend: sqlite, path: {tmp_path / 'records.db'}}}\n"
        f"routes:\n  - {{name: {ROUTE}, destination: phase3, key: [payload.game]}}\n"
    )
    return path


@pytest.fixture
def sync(config_path: Path) -> Iterator[SyncFilter]:
    with SyncFilter(config_path) as f:
        yield f


def report(status: str) -> dict[str, Any]:
    return {"game": "g1", "status": status}


def test_all_lists_the_public_surface_and_every_name_in_it_resolves() -> None:
    assert set(library.__all__) == PUBLIC
    assert len(library.__all__) == len(PUBLIC)
    for name in library.__all__:
        assert getattr(library, name) is not None, name
    assert set(library.__all__) <= set(dir(library))


def test_importing_filter_loads_neither_the_engine_nor_any_google_client() -> None:
    code = (
        "import sys, pubsub_filter; print(sorted(m for m in sys.modules if m.startswith(('google', 'pubsub_filter.'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'filter'}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(done.stdout.replace("'", '"')) == [
        "pubsub_filter._version",
        "pubsub_filter.core",
        "pubsub_filter.core.errors",
    ]


def test_every_error_class_the_library_defines_derives_from_the_root_and_keeps_its_standard_base() -> None:
    for info in pkgutil.walk_packages(library.__path__, "pubsub_filter."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            public = not cls.__name__.startswith("_")
            if cls.__module__ == info.name and issubclass(cls, Exception) and public:
                assert issubclass(cls, FilterError), f"{info.name}.{cls.__name__} does not derive from FilterError"
    assert issubclass(FilterClosed, RuntimeError)
    assert issubclass(FenceError, ValueError)
    assert issubclass(FilterTypeError, TypeError)
    assert issubclass(UnknownRouteError, ValueError)
    for name in library.__all__:
        value = getattr(library, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, FilterError), name


def test_the_sync_api_opens_from_a_path_as_a_context_manager(config_path: Path) -> None:
    with SyncFilter(config_path) as f:
        outcome = f.process(ROUTE, report("out"), lambda fwd: fwd.data)
    assert outcome.ran and outcome.decision == "forwarded"
    assert json.loads(outcome.result or b"") == report("out")


async def test_the_async_api_opens_from_a_path_as_a_context_manager_the_same_way(config_path: Path) -> None:
    async def body(fwd: Forward) -> str:
        return fwd.route

    async with Filter(config_path) as f:
        first = await f.process(ROUTE, report("out"), body, message_id="m1")
        again = await f.process(ROUTE, report("out"), body, message_id="m2")
    assert (first.decision, first.result) == ("forwarded", ROUTE)
    assert again.decision == "suppressed" and not again.ran
    async with Filter.open(config_path) as g:  # the older spelling still works
        assert (await g.process(ROUTE, report("in"), body)).ran


def test_process_takes_a_message_and_raw_payloads_with_an_id_and_attributes(sync: SyncFilter) -> None:
    seen: list[Forward] = []
    as_message = sync.process(ROUTE, Message(json.dumps(report("a")).encode(), {}, "m1"), seen.append)
    as_bytes = sync.process(ROUTE, json.dumps(report("b")).encode(), seen.append, message_id="m2")
    as_text = sync.process(ROUTE, json.dumps(report("c")), seen.append, attributes={"source": "x"})
    as_dict = sync.process(ROUTE, report("d"), seen.append, message_id="m4", attributes={"source": "y"})
    redelivered = sync.process(ROUTE, report("d"), seen.append, message_id="m4")
    assert [o.decision for o in (as_message, as_bytes, as_text, as_dict)] == ["forwarded"] * 4
    assert [json.loads(f.data)["status"] for f in seen] == ["a", "b", "c", "d"]
    assert as_dict.record.message_id == "m4" and redelivered.decision == "duplicate"
    assert payload_message(report("e"), message_id="m5").message_id == "m5"


def test_process_takes_a_google_pubsub_message_received_or_built(sync: SyncFilter) -> None:
    published = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    built = PubsubMessage(
        data=json.dumps(report("a")).encode(), attributes={"source": "x"}, message_id="g1", publish_time=published
    )
    received = pubsub_v1.subscriber.message.Message(
        PubsubMessage(data=json.dumps(report("b")).encode(), message_id="g2", publish_time=published)._pb,
        "ack-id",
        3,
        queue.Queue(),
    )
    seen: list[Forward] = []
    first = sync.process(ROUTE, built, seen.append)
    second = sync.process(ROUTE, received, seen.append)
    assert (first.decision, first.record.message_id) == ("forwarded", "g1")
    assert (second.decision, second.record.message_id) == ("forwarded", "g2")
    assert second.record.delivery_attempt == 3
    assert first.record.publish_time == published.timestamp()
    assert [json.loads(f.data)["status"] for f in seen] == ["a", "b"]


def test_process_takes_a_push_envelope_dict(sync: SyncFilter) -> None:
    envelope = {
        "message": {"data": base64.b64encode(json.dumps(report("a")).encode()).decode(), "messageId": "p1"},
        "subscription": "projects/p/subscriptions/s",
    }
    outcome = sync.process(ROUTE, envelope, lambda fwd: json.loads(fwd.data))
    assert outcome.decision == "forwarded" and outcome.record.message_id == "p1"
    assert outcome.result == report("a")


@pytest.mark.parametrize("given", [42, object(), None, {1, 2}])
def test_process_refuses_what_it_cannot_read_as_a_message_with_a_library_type_error(
    sync: SyncFilter, given: object
) -> None:
    with pytest.raises(FilterTypeError, match="cannot read") as caught:
        sync.process(ROUTE, given, lambda fwd: None)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, FilterError)


def test_an_id_or_attributes_beside_a_message_that_carries_its_own_is_refused(sync: SyncFilter) -> None:
    with pytest.raises(FilterTypeError, match="raw payload"):
        sync.process(ROUTE, Message(b"{}", {}, "m1"), lambda fwd: None, message_id="m2")


def test_decorating_for_a_route_the_config_lacks_fails_at_decoration(sync: SyncFilter) -> None:
    with pytest.raises(UnknownRouteError, match="no-such-route"):

        @on_payload(sync, "no-such-route")
        def handle(payload: Any) -> None:
            raise AssertionError("never runs")


def test_a_nack_and_a_closed_filter_are_caught_by_the_root_error(config_path: Path) -> None:
    f = SyncFilter(config_path)
    f.close()
    with pytest.raises(FilterError):
        f.process(ROUTE, report("a"), lambda fwd: None)
    assert issubclass(Nack, FilterError)


def test_the_example_imports_only_the_public_surface() -> None:
    tree = ast.parse((ROOT / "examples" / "inprocess.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pubsub_filter":
            assert node.module == "pubsub_filter", f"the example imports from {node.module}"
            assert {a.name for a in node.names} <= set(library.__all__)
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("pubsub_filter") for a in node.names)


def test_a_route_with_cache_result_returns_a_redelivery_the_result_of_its_forward(tmp_path: Path) -> None:
    path = tmp_path / "filter.yaml"
    path.write_text(
        f"store: {{backend: sqlite, path: {tmp_path / 'state.db'}}}\n"
        f"records: {{backend: sqlite, path: {tmp_path / 'records.db'}}}\n"
        f"routes:\n  - {{name: {ROUTE}, destination: phase3, key: [payload.game], cache_result: true}}\n"
    )
    with SyncFilter(path) as f:
        first = f.process(ROUTE, report("out"), lambda fwd: ["rebuilt", 1], message_id="m1")
        again = f.process(ROUTE, report("out"), lambda fwd: ["rebuilt", 2], message_id="m1")
        unkept = f.process(ROUTE, report("in"), lambda fwd: "x", message_id="m2", cache_result=False)
        redelivered = f.process(ROUTE, report("in"), lambda fwd: "y", message_id="m2")
    assert (first.result, again.result, again.cached, again.ran) == (["rebuilt", 1], ["rebuilt", 1], True, False)
    assert (unkept.result, redelivered.decision, redelivered.result) == ("x", "duplicate", None)


def test_a_decorated_handler_keeps_its_result_for_a_redelivery_when_asked(sync: SyncFilter) -> None:
    runs: list[str] = []

    @on_payload(sync, ROUTE, cache_result=True)
    def rebuild(payload: dict[str, Any]) -> dict[str, str]:
        runs.append(payload["status"])
        return {"rebuilt": payload["status"]}

    first = rebuild(report("out"), message_id="m1")
    again = rebuild(report("out"), message_id="m1")
    assert (first.result, again.result, again.cached, runs) == ({"rebuilt": "out"}, {"rebuilt": "out"}, True, ["out"])


def test_a_result_that_cannot_be_kept_is_not_raised_and_its_reason_stays_a_library_error(sync: SyncFilter) -> None:
    unkept = object()
    outcome = sync.process(ROUTE, report("out"), lambda fwd: unkept, message_id="m1", cache_result=True)
    again = sync.process(ROUTE, report("out"), lambda fwd: unkept, message_id="m1", cache_result=True)
    assert (outcome.result is unkept, outcome.committed, again.ran, again.result, again.cached) == (
        True,
        True,
        False,
        None,
        False,
    )
    assert issubclass(ResultNotStored, FilterError) and issubclass(ResultNotStored, ValueError)


def test_on_a_shadow_route_a_redelivery_runs_the_body_and_returns_its_own_result_not_a_kept_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "filter.yaml"
    path.write_text(
        f"store: {{backend: sqlite, path: {tmp_path / 'state.db'}}}\n"
        f"records: {{backend: sqlite, path: {tmp_path / 'records.db'}}}\n"
        f"routes:\n  - {{name: {ROUTE}, destination: phase3, key: [payload.game], mode: shadow, cache_result: true}}\n"
    )
    with SyncFilter(path) as f:
        f.process(ROUTE, report("out"), lambda fwd: "first", message_id="m1")
        again = f.process(ROUTE, report("out"), lambda fwd: "second", message_id="m1")
    assert (again.ran, again.result, again.cached) == (True, "second", False)


def test_the_error_tree_in_core_errors_names_every_error_class_under_its_parent() -> None:
    from pubsub_filter.core import errors

    doc = errors.__doc__ or ""
    drawn_parent: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (column, name) of the lines above, by depth
    for line in doc[doc.index("    FilterError") :].splitlines():
        match = re.search(r"(?:[├└]── |^    )([A-Z]\w+)", line)
        if not match:
            continue
        column, name = match.start(1), match.group(1)
        while stack and stack[-1][0] >= column:
            stack.pop()
        drawn_parent[name] = stack[-1][1] if stack else None
        stack.append((column, name))
    defined = {}
    for info in pkgutil.walk_packages(library.__path__, "pubsub_filter."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, library.FilterError) and cls.__module__ == module.__name__:
                defined[cls.__name__] = cls
    assert set(drawn_parent) == set(defined), "draw each error class in core/errors.py's tree"
    for name, cls in defined.items():
        ours = [b.__name__ for b in cls.__bases__ if issubclass(b, library.FilterError)]
        assert drawn_parent[name] == (ours[0] if ours else None), f"{name} is drawn under the wrong parent"
