"""Process-wide event counts for health output and tests (logs carry the same events)."""

from collections import Counter

counts: Counter[str] = Counter()
