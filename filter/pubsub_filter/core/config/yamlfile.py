"""Read the config's YAML with PyYAML's safe loader, refusing duplicate keys.

PyYAML keeps the last of two equal keys, so a second `routes:` silently replaces the
first. Text no UTF-8 writer takes (a lone surrogate, from an escape such as "\\ud800") is
refused too, each on its line. Duplicates are collected at every level of nesting, each with its line, and all
reported together. Keys brought in by a merge (`<<: *defaults`) may be overridden: that
is what a merge is for.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.escaped import encodable, unwritable


class DuplicateKeys(FilterError):
    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: str):
        super().__init__(stream)
        self.duplicates: list[tuple[int, str]] = []

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> Any:
        # A double-quoted "\ud800" is a lone surrogate: no UTF-8 writer takes it (an attribute
        # name, a log line, a record), so it is refused here, on its line, with the duplicates.
        value = super().construct_scalar(node)
        if isinstance(value, str) and not encodable(value):
            line = node.start_mark.line + 1
            self.duplicates.append((line, f"line {line}: {unwritable(value)}"))
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
                    (
                        line,
                        f"line {line}: {key}: the same key is already on line {first_line[key]} "
                        "(YAML keeps only the last one)",
                    )
                )
            else:
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """The document, or `DuplicateKeys`; `yaml.YAMLError` for anything that is not YAML."""
    loader = _Loader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    if loader.duplicates:
        raise DuplicateKeys([text for _, text in sorted(loader.duplicates)])
    return data
