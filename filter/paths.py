"""Field paths such as `payload.game.id` or `attributes.source`: parsed once, resolved per message."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_MISSING: Any = object()


class PathError(ValueError):
    """A path string that is not `payload[.a.b...]` or `attributes.name`."""


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
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return _MISSING
        return node


MISSING = _MISSING
