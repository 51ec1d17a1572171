"""pydantic's validation errors said in the config's own words (`pubsub_filter.core.config.schema.parse`).

A problem names where it is (`route 'NAME': KEY`, `store.backend`), what was written, and
what would be right: the allowed values, a "did you mean" for a misspelling, the fix for
a common slip (`key: payload.id` for `key: [payload.id]`). A misspelt required key is
reported once, as the unknown key with its correction, not again as the missing one.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel

Loc = tuple[Any, ...]

_BACKEND_SECTIONS = {"store": "sqlite", "publisher": "outbox", "records": "sqlite"}
_TAGS = ("sqlite", "firestore", "outbox", "pubsub", "bigquery")  # pydantic puts the union member in the location
_VALIDATOR_STEPS = ("function-after", "function-before", "function-wrap", "function-plain")

# What a `pattern` constraint asks for, in words (keyed by the field's name).
_PATTERNS = {
    "name": "is not a valid route name: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit",
    "service_account": "is not a service account: write its email, e.g. pubsub-push@PROJECT.iam.gserviceaccount.com",
}

# pydantic's error type → what the value must be, for the type errors a YAML file commonly makes.
_TYPES = {
    "string_type": "text",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}

_BOUNDS = {
    "greater_than": "more than",
    "greater_than_equal": "at least",
    "less_than": "less than",
    "less_than_equal": "at most",
}


def where(loc: Loc, raw: Any) -> str:
    """Turn pydantic's location into `route 'injury-report': key[1]`."""
    parts = plain_loc(loc)
    if len(parts) >= 2 and parts[0] == "routes" and isinstance(parts[1], int):
        idx = parts[1]
        name = None
        if isinstance(raw, dict) and isinstance(raw.get("routes"), list) and idx < len(raw["routes"]):
            entry = raw["routes"][idx]
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                name = entry["name"]  # `route 5` would read as a position
        head = f"route {name!r}" if name else f"routes[{idx}]"
        rest = _dotted(parts[2:])
        return f"{head}: {rest}" if rest else head
    return _dotted(parts) or "(top level)"


class Said(NamedTuple):
    """One error in plain words (`WHERE: what is wrong`), and the path of what it is about as the
    file writes it; `of_key` when it is about the key itself (an unknown key), not its value."""

    loc: Loc
    text: str
    of_key: bool = False


def describe(errors: Sequence[Any], raw: dict[str, Any], root: type[BaseModel]) -> list[Said]:
    """One `WHERE: what is wrong` line per error, in plain words."""
    corrected = _corrected_required(errors, root)
    found = []
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "missing" and plain_loc(loc) in corrected:
            continue  # said once, by the misspelt key's "did you mean"
        found.append(_located(err, loc, raw, root))
    return found


def _located(err: Any, loc: Loc, raw: dict[str, Any], root: type[BaseModel]) -> Said:
    if err["type"] == "union_tag_invalid":
        at = (*loc, "backend")
        return Said(plain_loc(at), f"{where(at, raw)}: {_message(err, loc, raw, root)}")
    return Said(plain_loc(loc), f"{where(loc, raw)}: {_message(err, loc, raw, root)}", err["type"] == "extra_forbidden")


def _message(err: Any, loc: Loc, raw: dict[str, Any], root: type[BaseModel]) -> str:
    kind, value = err["type"], err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_key(loc, raw, root)
    if kind == "missing":
        return "is required but missing" + (": the config needs at least one route" if loc == ("routes",) else "")
    if kind == "literal_error":
        return _not_one_of(value, _literals(root, loc))
    if kind == "union_tag_invalid":
        return _not_one_of(ctx.get("tag", value), re.findall(r"'([^']*)'", str(ctx.get("expected_tags", ""))))
    if kind == "list_type":
        return _not_a_list(loc, value, root)
    if kind == "too_short":
        return "must not be empty" + (": the config needs at least one route" if loc == ("routes",) else "")
    if kind == "string_pattern_mismatch":
        return f"{value!r} {_PATTERNS.get(str(loc[-1]), 'is not valid here: see the config reference')}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), None)
        limit = f"{bound:g}" if isinstance(bound, int | float) else str(bound)
        return f"{value!r} is out of range: it must be {_BOUNDS[kind]} {limit}"
    if kind in _TYPES:
        return _wrong_type(loc, value, _TYPES[kind])
    return str(err["msg"]).removeprefix("Value error, ")


# --- unknown keys -------------------------------------------------------------------


def _unknown_key(loc: Loc, raw: dict[str, Any], root: type[BaseModel]) -> str:
    key, parent = str(loc[-1]), loc[:-1]
    here = _model_at(root, parent)
    allowed = _keys(here)
    guess = _closest(key, allowed)
    if guess:
        return f"unknown key; did you mean {guess!r}?"
    backend = _backend_written(parent, raw)
    said = "unknown key"
    if backend:
        name, defaulted = backend
        said = f"unknown key for backend {name}" + (" (the default when backend is not set)" if defaulted else "")
        owner = next((_backend_of(m) for m in _candidates(root, parent[0]) if key in _keys(m)), None)
        if owner and owner != name:
            return f"{said}; {key} belongs to backend {owner}: write backend: {owner}"
    home = _home_of(key, root, here)
    if home:
        return f"unknown key here; {key} belongs {home}"
    return f"{said}; the keys here are {', '.join(sorted(allowed))}" if allowed else said


def _home_of(key: str, root: type[BaseModel], here: type[BaseModel] | None) -> str | None:
    """Where else in the config `key` is a key: a section's key written in a route, and the like."""
    if here is not root and key in _keys(root):
        return "at the top level"
    homes = {
        "in each route" if name == "routes" else f"in section {name}"
        for name, field in root.model_fields.items()
        for model in _models_in(field.annotation)
        if model is not here and key in _keys(model)
    }
    return homes.pop() if len(homes) == 1 else None  # a key of several sections (backend, path) says nothing


def _backend_written(parent: Loc, raw: dict[str, Any]) -> tuple[str, bool] | None:
    """For a key of a backend section: the backend it was read as, and whether that is the default."""
    if len(plain_loc(parent)) != 1 or parent[0] not in _BACKEND_SECTIONS:
        return None
    written = raw.get(parent[0])
    backend = written.get("backend") if isinstance(written, dict) else None
    if isinstance(backend, str):
        return backend, False
    return _BACKEND_SECTIONS[parent[0]], True


def _corrected_required(errors: Sequence[Any], root: type[BaseModel]) -> set[Loc]:
    """The missing keys that an unknown key beside them is a misspelling of."""
    missing = {plain_loc(tuple(e["loc"])) for e in errors if e["type"] == "missing"}
    corrected = set()
    for err in errors:
        if err["type"] != "extra_forbidden":
            continue
        loc = tuple(err["loc"])
        guess = _closest(str(loc[-1]), _keys(_model_at(root, loc[:-1])))
        target = (*plain_loc(loc[:-1]), guess)
        if guess and target in missing:
            corrected.add(target)
    return corrected


def _closest(word: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


# --- values -------------------------------------------------------------------------


def _not_one_of(value: Any, allowed: Sequence[Any]) -> str:
    if not allowed:
        return f"{value!r} is not an allowed value"
    text = f"{value!r} is not one of {', '.join(str(a) for a in allowed)}"
    guess = _closest(value, [str(a) for a in allowed]) if isinstance(value, str) else None
    return f"{text}; did you mean {guess!r}?" if guess else text


def _not_a_list(loc: Loc, value: Any, root: type[BaseModel]) -> str:
    key = str(loc[-1]) if loc else "it"
    if loc == ("routes",):
        return "must be a list of routes, each starting with '- name: ...'"
    items = _candidates(_model_at(root, loc[:-1]), loc[-1]) if loc else []
    if items:  # a list of mappings (bypass conditions)
        return f"must be a list of mappings, each with keys among {', '.join(sorted(_keys(items[0])))}"
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return f"must be a list, even of one item: write {key}: [{value}]"
    return f"must be a list, e.g. {key}: [a, b]"


def _wrong_type(loc: Loc, value: Any, wanted: str) -> str:
    section = loc[0] if len(loc) == 1 else None
    if section in _BACKEND_SECTIONS and isinstance(value, str):
        return f"must be a mapping of keys to values, e.g. {section}: {{backend: {value}}}"
    return f"{value!r} is not {wanted}"


# --- the models behind a location ----------------------------------------------------


def plain_loc(loc: Loc) -> Loc:
    """The location as written in the file: without pydantic's validator steps and union tags."""
    parts = [p for p in loc if not (isinstance(p, str) and p in _VALIDATOR_STEPS)]
    if len(parts) >= 2 and parts[0] in _BACKEND_SECTIONS and isinstance(parts[1], str) and parts[1] in _TAGS:
        parts = [parts[0], *parts[2:]]
    return tuple(parts)


def _dotted(parts: Sequence[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model whose keys are at `loc` (list positions and union tags followed), if any."""
    model: type[BaseModel] | None = root
    parts = [p for p in loc if not (isinstance(p, str) and p in _VALIDATOR_STEPS)]
    while parts and model is not None:
        name = parts.pop(0)
        if isinstance(name, int):
            continue
        models = _candidates(model, name)
        while parts and isinstance(parts[0], int):
            parts.pop(0)
        if len(models) > 1 and parts and parts[0] in {_backend_of(m) for m in models}:
            tag = parts.pop(0)
            models = [m for m in models if _backend_of(m) == tag]
        model = models[0] if len(models) == 1 else None
    return model


def _candidates(model: type[BaseModel] | None, name: Any) -> list[type[BaseModel]]:
    field = _field(model, name)
    return list(_models_in(field.annotation)) if field is not None else []


def _field(model: type[BaseModel] | None, name: Any) -> Any:
    if model is None:
        return None
    for field_name, field in model.model_fields.items():
        if name in (field_name, field.alias):
            return field
    return None


def _keys(model: type[BaseModel] | None) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()] if model else []


def _backend_of(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("backend")
    values = _literal_values(field.annotation) if field else []
    return str(values[0]) if values else None


def _literals(root: type[BaseModel], loc: Loc) -> list[Any]:
    field = _field(_model_at(root, loc[:-1]), loc[-1]) if loc else None
    return _literal_values(field.annotation) if field is not None else []


def _literal_values(tp: Any) -> list[Any]:
    if get_origin(tp) is Literal:
        return list(get_args(tp))
    return [v for arg in _inner(tp) for v in _literal_values(arg)]


def _models_in(tp: Any) -> Iterable[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        yield tp
        return
    for arg in _inner(tp):
        yield from _models_in(arg)


def _inner(tp: Any) -> tuple[Any, ...]:
    """The types inside a union, list, tuple or Annotated (not a Literal's values)."""
    origin = get_origin(tp)
    if origin is Annotated:
        return (get_args(tp)[0],)
    if origin in (Union, types.UnionType, list, tuple, Sequence):
        return tuple(a for a in get_args(tp) if a is not Ellipsis)
    return ()
