"""Where a config file says each thing: the line and column of every key and value, by the path
pydantic's errors and the rules name it with (`("routes", 2, "mode")`).

A problem is said with its place, `filter.yaml:14:11: route 'r': mode: ...`, the way compilers
and linters say theirs (an editor or a terminal opens the file there). A place is looked up by
the problem's path; a path the file does not hold (a key that is missing, a default that
clashes) is placed at the nearest thing above it that the file does hold, and a problem with
nothing above it in the file (a config built in code) has no place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Loc = tuple[Any, ...]


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """A place in the file, both counted from 1 as editors count them."""

    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Located:
    """One problem, in the config's words, and where the file says what it is about (None: nowhere)."""

    text: str
    position: Position | None = None

    def said(self, source: str) -> str:
        """`filter.yaml:14:11: text`, or `<config>: text` when it has no place."""
        return f"{source}:{self.position}: {self.text}" if self.position else f"{source}: {self.text}"


def in_line_order(problems: list[Located]) -> list[Located]:
    """Those without a place first (about the file as a whole), then by place; each said once."""
    unique = list(dict.fromkeys(problems))  # a rule the model checks too is said once
    return sorted(unique, key=lambda p: (p.position is not None, p.position or Position(0, 0)))


def _frozen(mapping: Mapping[Loc, Position]) -> Mapping[Loc, Position]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Lines:
    """Each path's key (`keys`) and value (`values`) in one file. A value is placed where it is
    written when it starts on its key's line (a scalar, a `{...}` or `[...]`), else at its key."""

    keys: Mapping[Loc, Position] = field(default_factory=dict)
    values: Mapping[Loc, Position] = field(default_factory=dict)
    #: the paths whose value is a mapping: pydantic puts a list index after one written where a
    #: list of one is taken (`bypass: {field: ...}` is read as `bypass: [{field: ...}]`)
    mappings: frozenset[Loc] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", _frozen(self.keys))
        object.__setattr__(self, "values", _frozen(self.values))

    def of(self, loc: Loc, *, key: bool = False) -> Position | None:
        """Where `loc` is (its key's place with `key`, e.g. for an unknown key), else where the
        nearest path above it is; None when the file holds none of them."""
        path = self._written(loc)
        exact = (self.keys if key else self.values).get(path)
        if exact is not None:
            return exact
        for end in range(len(path) - 1, 0, -1):
            found = self.values.get(path[:end])
            if found is not None:
                return found
        return None

    def _written(self, loc: Loc) -> Loc:
        parts: list[Any] = []
        for part in loc:
            if type(part) is int and part == 0 and tuple(parts) in self.mappings:
                continue  # the one item a single mapping was read as
            parts.append(part)
        return tuple(parts)


#: A config that comes from no file (a dict built in code): its problems have no place.
NO_LINES = Lines()
