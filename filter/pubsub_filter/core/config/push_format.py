"""What a route's `push_format` lets its key and bypass conditions read: an unwrapped push
carries the attributes as HTTP headers, whose names arrive lower-cased; one without metadata
carries none at all (docs/deploying.md, "Payload unwrapping").

Checked twice with the same words: by `Route` itself (a route built in code), and as a rule
across keys (`rules`), which reads the raw route leniently so that a broken key beside them
(a misspelt `mode`, which stops pydantic before a route's own check) hides no such problem.
`schema.parse` says a problem found both ways once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pubsub_filter.core.paths import Path, PathError


def attribute_names_problem(push_format: str, paths: Iterable[Path]) -> str | None:
    """Why the attributes `paths` name cannot be read under `push_format`; None when they can."""
    named = sorted({str(p) for p in paths if p.root == "attributes"})
    if push_format == "unwrapped_no_metadata" and named:
        return (
            f"push_format unwrapped_no_metadata: a push without metadata carries no attributes, "
            f"so {', '.join(named)} is never found; use payload paths, or push_format unwrapped"
        )
    if push_format != "unwrapped":
        return None
    upper = [n for n in named if n != n.lower()]
    if upper:
        return (
            f"push_format unwrapped: attribute names arrive as HTTP headers, in lower case; "
            f"write {', '.join(u.lower() for u in upper)} (not {', '.join(upper)})"
        )
    return None


def raw_paths(route: dict[str, Any]) -> list[Path]:
    """The paths a raw route's key and bypass conditions name, those that parse (a path that does
    not is a field error of its own)."""
    key = route.get("key")
    bypass = route.get("bypass")
    conditions = [bypass] if isinstance(bypass, dict) else bypass if isinstance(bypass, list) else []
    texts = [*(key if isinstance(key, list) else []), *(c.get("field") for c in conditions if isinstance(c, dict))]
    found = []
    for text in texts:
        try:
            found.append(Path.parse(text))
        except PathError:
            continue
    return found
