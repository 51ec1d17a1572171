"""Dead letters on the Pub/Sub emulator, for trying `pubsub-filter replay` locally.

The emulator does not dead-letter the way Pub/Sub does: a push subscription whose endpoint
keeps failing never moves its messages to the dead-letter topic, and an ordered subscription
stops delivering anything once one of its messages ran out of attempts. A pull subscription
without ordering does dead-letter. This script makes one: it creates a source topic, a
dead-letter topic with its `-dlq-sub`, and an unordered pull subscription with a dead-letter
policy, publishes the messages given on the command line, and nacks each until Pub/Sub's
emulator moves it to the dead-letter topic. Then:

    pubsub-filter replay local-source-sub-dlq-sub --project "$GOOGLE_CLOUD_PROJECT" --dry-run

Run with PUBSUB_EMULATOR_HOST and GOOGLE_CLOUD_PROJECT set:

    python examples/local_dead_letters.py '{"game_date": "2025-01-10", "players": []}'
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from google.api_core import exceptions
from google.cloud import pubsub_v1

ATTEMPTS = 5  # the fewest Pub/Sub allows
SOURCE, SUBSCRIPTION = "local-source", "local-source-sub"
DEAD_LETTERS, DEAD_LETTER_SUB = f"{SUBSCRIPTION}-dlq", f"{SUBSCRIPTION}-dlq-sub"


def main(payloads: list[str]) -> int:
    if not os.environ.get("PUBSUB_EMULATOR_HOST") or not os.environ.get("GOOGLE_CLOUD_PROJECT"):
        print("set PUBSUB_EMULATOR_HOST and GOOGLE_CLOUD_PROJECT (this script is for the emulator)", file=sys.stderr)
        return 2
    project = os.environ["GOOGLE_CLOUD_PROJECT"]
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    source, dead_letters = publisher.topic_path(project, SOURCE), publisher.topic_path(project, DEAD_LETTERS)
    subscription = subscriber.subscription_path(project, SUBSCRIPTION)
    for topic in (source, dead_letters):
        with contextlib.suppress(exceptions.AlreadyExists):
            publisher.create_topic(name=topic)
    for name, topic, policy in (
        (subscriber.subscription_path(project, DEAD_LETTER_SUB), dead_letters, None),
        (subscription, source, {"dead_letter_topic": dead_letters, "max_delivery_attempts": ATTEMPTS}),
    ):
        # no retry policy: the emulator redelivers a nack at once
        with contextlib.suppress(exceptions.AlreadyExists):
            subscriber.create_subscription(request={"name": name, "topic": topic, "dead_letter_policy": policy})
    ids = {publisher.publish(source, payload.encode()).result() for payload in payloads}
    last: set[str] = set()  # nacked on their last attempt
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # The emulator moves a message on the pull after its last attempt: nack until that pull.
        try:
            pulled = subscriber.pull(request={"subscription": subscription, "max_messages": 100}, timeout=1.0)
            received = list(pulled.received_messages)
        except exceptions.DeadlineExceeded:
            received = []
        last |= {r.message.message_id for r in received if r.delivery_attempt >= ATTEMPTS}
        if received:
            ack_ids = [r.ack_id for r in received]
            subscriber.modify_ack_deadline(
                request={"subscription": subscription, "ack_ids": ack_ids, "ack_deadline_seconds": 0}
            )
        if last >= ids and not any(r.message.message_id in ids for r in received):
            break
    left = ids - last
    subscriber.close()
    if left:
        print(f"{len(left)} message(s) not dead-lettered within 60 s", file=sys.stderr)
        return 1
    print(f"{len(ids)} message(s) in {DEAD_LETTER_SUB}; try:")
    print(f"  pubsub-filter replay {DEAD_LETTER_SUB} --project {project} --dry-run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ['{"game_date": "2025-01-10", "players": []}']))
