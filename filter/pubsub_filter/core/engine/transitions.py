"""What a key's stored state becomes when the engine writes it: claimed (a fenced lease taken)
and forwarded (the new fingerprint committed). Pure; the engine does the conditional writes."""

from __future__ import annotations

from dataclasses import replace

from pubsub_filter.core.engine.judge import Outgoing
from pubsub_filter.core.model import KeyState, Lease, Message

#: How many recently forwarded message ids each key remembers, to answer redeliveries.
RECENT = 20

#: The most result JSON a key keeps (one result at most that; older results go first to make room).
RESULTS_MAX_BYTES = 64 * 1024


def claimed(state: KeyState | None, lease: Lease, keep_until: float) -> KeyState:
    """`state` holding `lease`, kept at least until `keep_until`.

    Everything else stays as it was (a released lease must leave the last forward intact),
    except when the lease taken over held other content than the state records: its holder
    may have published it, and our lease is about to overwrite the only trace of that. The
    claim then writes the content downstream as unknown (`KeyState.unknown_downstream`), so
    that if this forward fails or dies too, the next message for the key is still forwarded.
    """
    base = state or KeyState()
    if base.lease is not None and base.fingerprint is not None and base.lease.fingerprint != base.fingerprint:
        base = base.unknown_downstream()
    return replace(
        base,
        fence=lease.fence,
        lease=lease,
        expires_at=max(base.expires_at or 0.0, keep_until),
    )


def forwarded(
    state: KeyState | None,
    msg: Message,
    fp: str,
    fence: int,
    out: Outgoing,
    now: float,
    keep_until: float,
    result: str | None = None,
) -> KeyState:
    """The state after `msg` (fingerprint `fp`) was forwarded under `fence`: no lease, `msg` among the
    recent, and with `result` (JSON text, at most `RESULTS_MAX_BYTES`) among the kept results."""
    base = state or KeyState()
    recent = (*base.recent, (msg.message_id, fp))[-RECENT:]
    return KeyState(
        fingerprint=fp,
        forwarded_at=now,
        message_id=msg.message_id,
        publish_time=msg.publish_time if msg.publish_time is not None else base.publish_time,
        recent=recent,
        fence=fence,
        lease=None,
        expires_at=keep_until,
        rows=out.rows,
        full_fingerprint=out.full_fingerprint,
        results=_kept(base.results, recent, (msg.message_id, fp, result) if result is not None else None),
        selection=out.selection,
    )


def _kept(
    results: tuple[tuple[str, str, str], ...], recent: tuple[tuple[str, str], ...], new: tuple[str, str, str] | None
) -> tuple[tuple[str, str, str], ...]:
    """The results still worth keeping: those of forwards still recent, `new` last, the oldest
    dropped until they fit in `RESULTS_MAX_BYTES`."""
    if not results and new is None:
        return ()
    live = set(recent)
    kept = [r for r in results if (r[0], r[1]) in live and (new is None or r[:2] != new[:2])]
    if new is not None:
        kept.append(new)
    while kept and sum(len(r[2].encode()) for r in kept) > RESULTS_MAX_BYTES:
        del kept[0]
    return tuple(kept)
