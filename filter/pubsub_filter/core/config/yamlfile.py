"""Read the config's YAML with PyYAML's safe loader: the document, where each of its keys and
values is written (`lines.Lines`), and what the file itself gets wrong.

PyYAML keeps the last of two equal keys, so a second `routes:` silently replaces the first:
each duplicate is a problem on its line, at every level of nesting. The document (with the last
of the two, as YAML reads it) is still validated, so a duplicate hides no other problem. Keys
brought in by a merge (`<<: *defaults`) may be overridden: that is what a merge is for. Text no
UTF-8 writer takes (a lone surrogate, from an escape such as "\\ud800") is refused on its line
too; that stops the reading there, as the text would reach the other problems' words.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import yaml

from pubsub_filter.core.config.lines import Lines, Loc, Located, Position
from pubsub_filter.core.escaped import encodable, unwritable


@dataclass(frozen=True)
class Document:
    """A config file read: its data, where each thing in it is, and its problems as YAML.
    `readable` is False when the data must not be validated (a lone surrogate in it)."""

    data: Any
    lines: Lines
    problems: tuple[Located, ...] = ()
    readable: bool = True


def _at(mark: yaml.Mark) -> Position:
    return Position(mark.line + 1, mark.column + 1)


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[Located] = []
        self.surrogates: list[Located] = []
        # each mapping node's entries as constructed (merges flattened in, in the order YAML applies them)
        self.entries: dict[yaml.Node, list[tuple[Any, yaml.Node, yaml.Node]]] = {}

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> Any:
        # A double-quoted "\ud800" is a lone surrogate: no UTF-8 writer takes it (an attribute
        # name, a log line, a record), so it is refused here, on its line.
        value = super().construct_scalar(node)
        if isinstance(value, str) and not encodable(value):
            self.surrogates.append(Located(unwritable(value), _at(node.start_mark)))
        return value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base constructor reports an unhashable key itself
            line = key_node.start_mark.line + 1
            if key in first_line:
                self.duplicates.append(
                    Located(
                        f"{key}: the same key is already on line {first_line[key]} (YAML keeps only the last one)",
                        _at(key_node.start_mark),
                    )
                )
            else:
                first_line[key] = line
        mapping = super().construct_mapping(node, deep=deep)
        # node.value now holds the merged entries too; each key is constructed already (cached)
        self.entries[node] = [
            (key, key_node, value_node)
            for key_node, value_node in node.value
            if isinstance(key := self.construct_object(key_node, deep=True), Hashable)
        ]
        return mapping


def _same_line(node: yaml.Node) -> bool:
    """A value that starts where it is written on its key's line: a scalar, `{...}` or `[...]`."""
    return isinstance(node, yaml.ScalarNode) or bool(getattr(node, "flow_style", False))


def _lines(root: yaml.Node, entries: dict[yaml.Node, list[tuple[Any, yaml.Node, yaml.Node]]]) -> Lines:
    """Every path's place. Walked with a stack, each node once: an alias reaches a node again (a
    list may even hold itself), and a path under a second alias is placed at its key."""
    keys: dict[Loc, Position] = {}
    values: dict[Loc, Position] = {(): _at(root.start_mark)}
    mappings: set[Loc] = set()
    todo: list[tuple[yaml.Node, Loc]] = [(root, ())]
    seen: set[int] = set()
    while todo:
        node, path = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            mappings.add(path)
            # of a key written twice, the last is what YAML keeps (so a merge's key is overridden)
            kept = {key: (key_node, value_node) for key, key_node, value_node in entries.get(node, [])}
            for key, (key_node, value_node) in kept.items():
                here = (*path, key)
                keys[here] = _at(key_node.start_mark)
                values[here] = _at(value_node.start_mark) if _same_line(value_node) else keys[here]
                todo.append((value_node, here))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                keys[(*path, i)] = values[(*path, i)] = _at(item.start_mark)
                todo.append((item, (*path, i)))
    return Lines(keys, values, frozenset(mappings))


def read(text: str) -> Document:
    """The document and its places; `yaml.YAMLError` for anything that is not YAML."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
        lines = _lines(root, loader.entries) if root is not None else Lines()
    finally:
        loader.dispose()
    return Document(
        data,
        lines,
        tuple(sorted([*loader.duplicates, *loader.surrogates], key=lambda p: p.position or Position(0, 0))),
        readable=not loader.surrogates,
    )
