"""The odds-props route the tolerance specifications share: rows of players keyed by `player`,
a price that may move by 12 unnoticed, and a flag for each of price and status."""

from __future__ import annotations

from typing import Any


def props_route(name: str, destination: str, **more: Any) -> dict[str, Any]:
    """The route's config as a route of `filter.yaml` names it; `more` adds or replaces keys."""
    return {
        "name": name,
        "destination": destination,
        "key": ["payload.game_id"],
        "rows": "payload.props",
        "row_key": ["player"],
        "include": ["player", "price", "status"],
        "tolerance": {"price": 12},
        "changed_attributes": ["price", "status"],
        **more,
    }
