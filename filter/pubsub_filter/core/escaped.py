"""Text that cannot be written as UTF-8, written all the same: escaped, never dropped.

A Python string may hold a lone surrogate (`"\\ud800"`, from an escape in YAML or in code), which
no UTF-8 writer takes: a JSON encoder, SQLite, a Pub/Sub attribute. `check` refuses such text in
a config; a writer that meets one anyway (a record, a log line) writes it with the offending
characters as backslash escapes (`\\ud800`, six characters) rather than lose the whole row or line.
Only the failure path pays: writers try the text as it is first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def encodable(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unwritable(value: str) -> str:
    """Why `value` cannot be config text, in the config's own words (`check`)."""
    lone = next(f"\\u{ord(c):04x}" for c in value if 0xD800 <= ord(c) <= 0xDFFF)
    shown = text(value if len(value) <= 40 else value[:40] + "...")
    return (
        f"'{shown}' holds a lone surrogate ({lone}, from an escape such as \"\\ud800\"), which is not "
        "text: no attribute name, log line or record can carry it; write the character itself "
        "(or \\U0001F600 for one past \\uFFFF)"
    )


def text(value: str) -> str:
    """`value`, its lone surrogates escaped (`\\ud800`); the very string when it has none."""
    return value if encodable(value) else value.encode("utf-8", "backslashreplace").decode("utf-8")


def escaped(value: Any) -> Any:
    """`value` with every string in it (keys too, at any depth) written by `text`."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        return {escaped(k): escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escaped(v) for v in value]
    return value
