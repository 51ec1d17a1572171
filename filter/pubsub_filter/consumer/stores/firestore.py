"""Highest fences in Firestore: one document per route and key, written with preconditions only.

As the filter's own Firestore store: `create()` for a new entry (`AlreadyExists`: another
consumer came first), else `update()` on the `update_time` read (`FailedPrecondition`).
`expires_at` is a timestamp, for a TTL policy on the collection.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from google.api_core import exceptions as gexc

from pubsub_filter.backends.stores import TTL_FIELD
from pubsub_filter.backends.stores.firestore import FirestoreCollection
from pubsub_filter.consumer.fence import Seen

DEFAULT_COLLECTION = "pubsub-filter-fences"


class FirestoreFences(FirestoreCollection):
    default_collection = DEFAULT_COLLECTION

    def _doc(self, identity: str) -> Any:
        # ids have length and character limits; the identity is kept as a field for humans
        return self._client.collection(self.collection).document(hashlib.sha256(identity.encode()).hexdigest())

    async def read(self, identity: str) -> Seen | None:
        snap = await self._doc(identity).get(retry=None, timeout=self.timeout)
        if not snap.exists:
            return None
        data = snap.to_dict() or {}
        return Seen(int(data["fence"]), data[TTL_FIELD].timestamp(), snap.update_time)

    async def write(self, identity: str, seen: Seen | None, new: Seen) -> bool:
        fields = {"identity": identity, "fence": new.fence, TTL_FIELD: datetime.fromtimestamp(new.expires_at, tz=UTC)}
        ref = self._doc(identity)
        try:
            if seen is None:
                await ref.create(fields, retry=None, timeout=self.timeout)
            else:
                option = self._client.write_option(last_update_time=seen.version)
                await ref.update(fields, option=option, retry=None, timeout=self.timeout)
        except (gexc.AlreadyExists, gexc.FailedPrecondition, gexc.NotFound):
            return False
        return True
