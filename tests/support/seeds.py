"""The pipeline team's own hash functions, as written in the seeds: the reference our schemes must match."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any


class SmartIdempotencyMixin:
    """Seed 002, `compute_data_hash`, verbatim apart from the class scaffolding."""

    UNIQUE_KEYS: list[str] = []

    def __init__(self, unique_keys: list[str]):
        self.UNIQUE_KEYS = unique_keys

    def compute_data_hash(self, rows: list[dict[str, Any]]) -> str:
        sorted_rows = sorted(rows, key=lambda x: tuple(x.get(k) for k in self.UNIQUE_KEYS))
        excluded_fields = ["processed_at", "data_hash", "last_updated"]
        content_parts = []
        for row in sorted_rows:
            row_values = [str(row.get(k, "")) for k in sorted(row.keys()) if k not in excluded_fields]
            content_parts.append("|".join(row_values))
        content_string = "\n".join(content_parts)
        return hashlib.sha256(content_string.encode("utf-8")).hexdigest()


@dataclass
class TransactionEvent:
    timestamp: datetime
    account_id: str
    product_id: str
    side: str
    price: Decimal | float
    quantity: int
    event_type: str


def hash_events(events: list[TransactionEvent]) -> str:
    """Seed 001, `_hash_events`, verbatim."""
    event_signatures = sorted(
        [
            (
                e.timestamp.isoformat(),
                e.account_id,
                e.product_id,
                e.side,
                str(e.price),
                e.quantity,
                e.event_type,
            )
            for e in events
        ]
    )
    return hashlib.sha256(json.dumps(event_signatures).encode()).hexdigest()


def reference_canonical(payload: dict[str, Any], rows_field: str, include: list[str]) -> str:
    """The seeds' approach as most teams write it: json.loads, select, json.dumps(sort_keys), sha256."""
    rows = [{k: r[k] for k in include if k in r} for r in payload[rows_field]]
    rows.sort(key=lambda r: json.dumps(r, sort_keys=True))
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
