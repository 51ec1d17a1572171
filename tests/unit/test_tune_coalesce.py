"""`tune --coalesce`: the forwards a `coalesce` would have saved, from the recorded decisions."""

from __future__ import annotations

from typing import Any

import pytest

from pubsub_filter.core.ports import DecisionRow
from pubsub_filter.tools.tune_coalesce import parse_coalesce, saved


def row(at: float, decision: str, key: str | None = "k") -> DecisionRow:
    return DecisionRow(
        time=at, decision=decision, enforced=True, key=key, reason=None, fingerprint=None,
        previous_fingerprint=None, extra={},
    )  # fmt: skip


def test_a_burst_of_forwards_would_have_forwarded_once() -> None:
    rows = [row(i * 0.1, "forwarded") for i in range(10)]
    got: dict[str, Any] = saved(rows, quiet=0.5, max_wait=5.0)
    assert (got["forwards"], got["would_forward"], got["saved"], got["bursts"]) == (10, 1, 9, 1)


def test_a_key_that_never_goes_quiet_forwards_once_per_max_wait() -> None:
    rows = [row(i * 0.1, "forwarded") for i in range(100)]  # 10 s at 10 a second
    assert saved(rows, quiet=0.5, max_wait=2.0)["would_forward"] == 5


def test_forwards_apart_by_more_than_quiet_save_nothing_and_a_burst_without_a_forward_stays_without() -> None:
    rows = [row(0.0, "forwarded"), row(10.0, "forwarded"), row(20.0, "suppressed"), row(20.1, "suppressed")]
    got = saved(rows, quiet=1.0, max_wait=5.0)
    assert (got["would_forward"], got["saved"], got["bursts"]) == (2, 0, 3)


def test_keys_burst_on_their_own_and_keyless_or_answered_at_once_decisions_are_left_out() -> None:
    rows = [row(0.0, "forwarded", "a"), row(0.1, "forwarded", "b"), row(0.2, "fail_open", None), row(0.3, "stale")]
    assert saved(rows, quiet=1.0, max_wait=5.0)["would_forward"] == 2


def test_the_what_if_is_written_quiet_slash_max_wait() -> None:
    assert parse_coalesce("500ms/2s") == (0.5, 2.0)
    for bad in ("2s", "3s/1s", "x/1s"):
        with pytest.raises(ValueError):
            parse_coalesce(bad)
