"""The in-process API and the consumer's fence, on the embedded default (no services).

Run from anywhere: `python examples/inprocess.py`. It works in a fresh temporary directory
(state, records) and prints what happened to each message.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from pubsub_filter import Fences, SqliteFences, SyncFilter, on_payload

CONFIG = Path(__file__).resolve().with_name("inprocess.yaml")


def report(scraped: str, **statuses: str) -> dict[str, Any]:
    players = [{"player": p, "status": s, "scraped_at": scraped} for p, s in statuses.items()]
    return {"game_date": "2025-01-10", "players": players}


def main() -> None:
    os.chdir(tempfile.mkdtemp(prefix="pubsub-filter-example-"))
    # The library logs through `logging` and configures nothing: the terminal is the story's; the
    # decisions are in decisions.db (`pubsub-filter skip-rate`).
    attempts = 0

    with SyncFilter(CONFIG) as f:

        @on_payload(f, "injury-report")
        def rebuild_predictions(payload: dict[str, Any]) -> str:
            nonlocal attempts
            attempts += 1
            if attempts == 3:
                raise ConnectionError("the warehouse did not answer")
            return f"rebuilt for {len(payload['players'])} players"

        def show(step: str, **kw: Any) -> None:
            try:
                outcome = rebuild_predictions(**kw)
            except ConnectionError as exc:
                print(f"{step:<28} body raised {exc!r}: nack, the message comes again")
                return
            ran = f"ran: {outcome.result}" if outcome.ran else "skipped"
            print(f"{step:<28} {outcome.decision:<10} {ran} ({outcome.reason})")

        show("09:00 scrape", payload=report("09:00", lebron="out", curry="in"), message_id="m1")
        show("13:00 scrape, same statuses", payload=report("13:00", lebron="out", curry="in"), message_id="m2")
        show("17:00 scrape, one changed", payload=report("17:00", lebron="in", curry="in"), message_id="m3")
        show("21:00 scrape, warehouse down", payload=report("21:00", lebron="in", curry="out"), message_id="m4")
        show("redelivery of the 21:00 one", payload=report("21:00", lebron="in", curry="out"), message_id="m4")
        show("redelivered once more", payload=report("21:00", lebron="in", curry="out"), message_id="m4")

    async def consume() -> None:
        # Downstream of the sidecar: a lapsed holder's late copy (fence 1) lands after fence 2.
        fences = Fences(SqliteFences("consumer-fences.db"))
        for fence in ("2", "1"):
            copy = {"filter_route": "injury-report", "filter_key": "2025-01-10", "filter_fence": fence}
            admitted = await fences.admit(copy)
            print(f"consumer, fence {fence:<14} {'take' if admitted.accepted else 'drop':<10} ({admitted.reason})")
        await fences.close()

    asyncio.run(consume())
    print(f"state and records in {os.getcwd()}")


if __name__ == "__main__":
    main()
