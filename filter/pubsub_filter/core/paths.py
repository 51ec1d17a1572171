"""Field paths such as `payload.game.id` or `attributes.source`: parsed once, resolved per message.

A segment indexes a list only when it is ASCII digits (`payload.players.0.id`); any other
segment is an object key. `'²'.isdigit()` is True and `int('²')` raises, so "is it an
index" is decided here, once, for the parser and for every reader of a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pubsub_filter.core.errors import FilterError

_MISSING: Any = object()

_INDEX = re.compile(r"[0-9]+", re.ASCII)
# Spellings that look like list indexes but would silently never match: refused at parse time.
_NEGATIVE = re.compile(r"-[0-9]+", re.ASCII)
_BRACKETED = re.compile(r".*\[-?[0-9]+\]", re.ASCII)


class PathError(FilterError, ValueError):
    """A path string that is not `payload[.a.b...]` or `attributes.name`."""


def list_index(segment: str) -> int | None:
    """The list index a segment names, or None when it names an object key only."""
    return int(segment) if _INDEX.fullmatch(segment) else None


@dataclass(frozen=True, slots=True)
class Path:
    root: str  # "payload" or "attributes"
    parts: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Path:
        if not isinstance(text, str) or not text:
            raise PathError("a path must be a non-empty string such as payload.game_id")
        root, _, rest = text.partition(".")
        if root not in ("payload", "attributes"):
            raise PathError(f"{text!r} must start with 'payload.' or 'attributes.'")
        parts = tuple(rest.split(".")) if rest else ()
        if any(not p for p in parts):
            raise PathError(f"{text!r} has an empty segment")
        if root == "attributes" and len(parts) != 1:
            raise PathError(f"{text!r}: attributes are flat, write attributes.NAME")
        for p in parts if root == "payload" else ():
            if _NEGATIVE.fullmatch(p):
                raise PathError(f"{text!r}: list indexes count from 0 at the start; {p!r} is not supported")
            if _BRACKETED.fullmatch(p):
                raise PathError(f"{text!r}: write a list index as its own segment, e.g. payload.players.0.id")
        return cls(root, parts)

    def __str__(self) -> str:
        return ".".join((self.root, *self.parts))

    def resolve(self, payload: Any, attributes: Mapping[str, str]) -> Any:
        """The value at this path, or `MISSING` when any step is absent or not an object."""
        if self.root == "attributes":
            return attributes.get(self.parts[0], _MISSING)
        node = payload
        for part in self.parts:
            if isinstance(node, dict):
                node = node.get(part, _MISSING)
                if node is _MISSING:
                    return _MISSING
            elif isinstance(node, list) and (i := list_index(part)) is not None and i < len(node):
                node = node[i]
            else:
                return _MISSING
        return node


MISSING = _MISSING
