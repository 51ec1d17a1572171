"""One row of the skip-rate table: a route's decision counts in one bucket, and the rates
they give. Its own module so that `skiprate` (which folds and renders the rows) and
`skiprate_chart` (which draws them) both read it, neither importing the other for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pubsub_filter.core.compare.selection import FORWARDED_LABEL, SUPPRESSED_LABEL
from pubsub_filter.core.compare.tolerance import WITHIN_TOLERANCE
from pubsub_filter.core.model import Decision

#: Beside a decision, the names its records are also counted under: a suppression within
#: tolerance, and a forward or a suppression under a changed selection (the readers label them)
_APART = {Decision.FORWARDED: (FORWARDED_LABEL,), Decision.SUPPRESSED: (WITHIN_TOLERANCE, SUPPRESSED_LABEL)}
#: every decision, in the model's order: one column each, those counted apart beside theirs
DECISIONS = tuple(n for d in Decision for n in (str(d), *_APART.get(d, ())))
#: the columns shown only where some row has one (a route without a tolerance never has one)
OCCASIONAL = (WITHIN_TOLERANCE, FORWARDED_LABEL, SUPPRESSED_LABEL)
#: held back: acked and not published (noise_only is a suppression the audit sample looked into;
#: superseded, a burst's older message whose newest was held: `coalesce`)
SKIPPED = ("suppressed", WITHIN_TOLERANCE, SUPPRESSED_LABEL, "duplicate", "stale", "noise_only", "superseded")
#: acked: published (forwarded, fail_open) or held back
DECIDED = ("forwarded", FORWARDED_LABEL, "fail_open", *SKIPPED)


@dataclass
class SkipRow:
    route: str
    bucket: str | None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DECISIONS, 0))
    shadow: bool = False  # some decisions were made in shadow mode (enforced = false)
    enforced: bool = False  # some decisions were made in enforce mode
    enforced_skipped: int = 0  # suppressed + duplicate + stale actually held back

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def decided(self) -> int:
        return sum(self.counts[d] for d in DECIDED)

    @property
    def mode(self) -> str:
        if self.shadow:
            return "mixed" if self.enforced else "shadow"
        return "enforce"

    @property
    def skip_rate(self) -> float | None:
        """Percent of decided messages actually held back (enforced decisions only)."""
        decided = self.decided
        return None if decided == 0 else 100.0 * self.enforced_skipped / decided

    @property
    def would_skip(self) -> float | None:
        """Percent enforce mode would have held back; None unless some decisions were shadow."""
        decided = self.decided
        if not self.shadow or decided == 0:
            return None
        return 100.0 * sum(self.counts[d] for d in SKIPPED) / decided

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"route": self.route, "bucket": self.bucket, "mode": self.mode, "total": self.total}
        out.update(self.counts)
        rate, would = self.skip_rate, self.would_skip
        out["skip_rate"] = None if rate is None else round(rate, 2)
        out["would_skip"] = None if would is None else round(would, 2)
        return out
