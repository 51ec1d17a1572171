"""`pubsub-filter replay`: drain a dead-letter subscription back into the pipeline.

Modules: `options` (the command line, checked), `selection` (`--where`, `--since`,
`--until`), `deadletter` (one message and its replay attributes), `targets` (where it goes),
`rate` (`--rate`), `progress` (counts, bar, summary), `replayer` (the loop, leases and acks),
`command` (the run under signals and its exit status).

Messages are pulled from the dead-letter subscription in batches (synchronous `Pull` with a
short timeout; the run ends at the first pull that brings nothing new) and either

- **republished** (default) to the topic they originally came from: the attributes
  `CloudPubSubDeadLetterSourceSubscription` + `...SourceSubscriptionProject` name the
  subscription that gave up on the message, and that subscription's topic (looked up once
  per subscription) is the target; or to `--to TOPIC`; or
- run **through the filter** (`--through-filter --config FILE`): handed to `Engine.handle`
  for the route whose `subscription` is the source subscription (or `--route NAME`), so the
  engine decides as if the message had just arrived, with its original publish time:
  unchanged content is suppressed, content older than what was forwarded since is
  stopped by the stale guard, and nothing is re-published to the source topic (no
  re-cascade through the source topic's other subscribers).

**What a replayed message carries.** Data, ordering key and attributes are kept, plus:

- `filter_replay_original_message_id`: the id of the message as it sat in the dead-letter
  subscription, or the value already there if the message was replayed before. (Pub/Sub
  does not put the source message's id in the dead-letter attributes; the emulator gives
  the dead-lettered copy a new id.)
- `filter_replay_original_publish_time`: when the content was first published. The
  dead-lettered copy's own publish time is when it was dead-lettered, so this comes from
  an earlier `filter_replay_original_publish_time`, else `CloudPubSubDeadLetterSourceTopicPublishTime`,
  else (no better source) the copy's publish time. `effective_publish_time()` makes it the
  message's publish time for the stale guard, on every surface.
- `filter_replay_count`: 1, or one more than the value already there.

At most Pub/Sub's 100 attributes go out: the message's own are all kept, and the replay's are
added while there is room (the original publish time first; the id and count are left out when
there is none). A message with 100 of its own has no room for the publish time the stale guard
needs: it is not replayed and stays in the dead-letter subscription, counted as failed.

**The `CloudPubSubDeadLetter*` attributes are dropped from the republished message.** They
describe one past dead-lettering, not the message: left in place, a consumer of the source
topic would see a live message dressed as a dead letter, a key or bypass rule on attributes
could match them, and if the message is dead-lettered again Pub/Sub's fresh values would be
mixed with stale ones. What is worth keeping from them (the original publish time, the
dead-lettered id) is carried in the `filter_replay_*` attributes above.

**Nothing is lost.** A dead-lettered message is acked only after its republish is
confirmed by Pub/Sub (or, through the filter, after a decision the push endpoint would
ack). Everything else pulled in this run (filtered out by `--where`/`--since`/`--until`,
beyond `--max`, failed, listed by `--dry-run`) stays leased while the run lasts (so the
next pull brings new messages, not the same ones again) and is released with
`ModifyAckDeadline(0)` at the end. Interrupted at any point (Ctrl-C, SIGTERM, a crash, a
Pub/Sub error), what was not acked returns to the dead-letter subscription (at once if
the process could release it, otherwise after the subscription's ack deadline) and a
rerun carries on. The one window left is a crash between a confirmed republish and its
ack: that message is replayed once more on the next run (at-least-once, like Pub/Sub
itself; the filter then answers the copy as unchanged content).

Ctrl-C (or SIGTERM) once: stop starting new replays, finish the ones under way, ack what
was confirmed, release the rest, print the summary, exit 130. Twice: cancel what is under
way too.
"""
