"""One consumer process using the in-process API (run by tests/contract/test_inprocess_on_backends.py).

Usage: python -m tests.support.inprocess_worker CONFIG ROUTE MESSAGE_ID PAYLOAD_JSON

Decides one message with `SyncFilter.process`. The body prints `BODY <fence>` and then waits
for one line on stdin before it returns (`fail` makes it raise instead), so the test holds
the body open for as long as it needs: to kill the process inside it, or to race a second
process against it. Prints the outcome as one JSON line, `OUTCOME {...}`.
"""

from __future__ import annotations

import json
import sys

from pubsub_filter.core.model import Message
from pubsub_filter.inprocess import Forward, SyncFilter


def main(config: str, route: str, message_id: str, payload: str) -> None:
    def body(forward: Forward) -> str:
        print(f"BODY {forward.fence}", flush=True)
        line = sys.stdin.readline().strip()
        if line == "fail":
            raise RuntimeError("the body failed")
        return line

    with SyncFilter(config) as f:
        outcome = f.process(route, Message(payload.encode(), {}, message_id), body)
    print(
        "OUTCOME "
        + json.dumps(
            {
                "decision": str(outcome.decision),
                "reason": outcome.reason,
                "ran": outcome.ran,
                "committed": outcome.committed,
                "result": outcome.result,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
