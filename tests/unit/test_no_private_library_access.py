"""The filter uses libraries (OpenTelemetry, structlog, Google clients) through their public APIs only.

A private attribute (`x._name`) is read only on our own objects: `self`, `cls`, `super()`, and
names the module itself defines or imports from `filter`. Anything else is a library's
internals, which change without notice between releases.

`self` is ours only on a class of our own: in a subclass of a library's class, a private name
the library's class has (a method or property we override or call) or one our class reads on
`self` without ever setting it (an instance attribute the library's `__init__` set) is the
library's too. Each such reach is listed in `LIBRARY_REACH` with its reason, pinned by
`test_each_library_reach_is_still_where_it_was_checked` and capped in pyproject.toml.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pubsub_filter as package

ROOT = Path(package.__file__).parent

#: (module, attribute): private accesses on library objects with no public way yet, and why.
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        # google-cloud-firestore's AsyncClient has no public way to close its gRPC channel
        # (its `close()` closes only the HTTP session): the channel is built lazily here.
        ("backends/stores/firestore.py", "_firestore_api_internal"),
        # our own SyncFilter's (a local name the check cannot tell from a library object)
        ("inprocess/handlers.py", "_call"),
        # os._exit: the standard library's documented way to end a process without waiting for
        # its threads (sys.exit would wait for the very threads that hold a stop past its budget)
        ("runtime/backstop.py", "_exit"),
    }
)


#: (module, class, private name): what a subclass of ours reaches inside its library base class.
LIBRARY_REACH: dict[tuple[str, str, str], str] = {
    # google-cloud-firestore 2.x builds its gRPC channel in these two places and offers no public
    # way to pass channel options: ReconnectingClient overrides both so the channel redials a lost
    # connection at least every second (RECONNECT_OPTIONS), reading the client's own emulator host
    # and credentials as the library's versions of the two do. Checked on 2.34 (pyproject: <2.35).
    ("backends/stores/firestore.py", "ReconnectingClient", "_firestore_api"): "the channel's options",
    ("backends/stores/firestore.py", "ReconnectingClient", "_firestore_api_helper"): "the channel's options",
    ("backends/stores/firestore.py", "ReconnectingClient", "_emulator_channel"): "the emulator's options",
    ("backends/stores/firestore.py", "ReconnectingClient", "_emulator_host"): "the emulator's address",
    ("backends/stores/firestore.py", "ReconnectingClient", "_credentials"): "the emulator's token",
}


def _ours(module: ast.Module) -> set[str]:
    """Names bound in `module` to our own things: its classes, functions and module-level
    assignments, and whatever it imports from `filter`."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pubsub_filter"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.asname or alias.name for alias in node.names if alias.name.startswith("pubsub_filter"))
    for node in module.body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _owner(value: ast.expr) -> str | None:
    """The name an attribute chain starts from (`a` in `a.b._c`), or "super()"."""
    while isinstance(value, ast.Attribute):
        value = value.value
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
        return "super()"
    return None


def _private_getattr(node: ast.AST) -> bool:
    """`getattr(x, "_name", ...)` on anything but `self`: the same read, spelled to dodge a linter."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and node.args[1].value.startswith("_")
        and not node.args[1].value.startswith("__")
        and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))
    )


def private_accesses(source: str, path: str) -> list[str]:
    module = ast.parse(source)
    ours = _ours(module) | {"self", "cls"}
    found = []
    for node in ast.walk(module):
        if _private_getattr(node) and (path, node.args[1].value) not in ALLOWED:  # type: ignore[attr-defined]
            assert isinstance(node, ast.Call)
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
            continue
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = _owner(node.value)
        if owner in ours or (path, node.attr) in ALLOWED:
            continue
        if owner == "super()" and isinstance(node.value, ast.Call):
            # our own base class's private is ours; a library base class's is not
            found.append(f"{path}:{node.lineno}: super().{node.attr}")
            continue
        found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def _set_on_self(cls: ast.ClassDef) -> set[str]:
    """Private names our class body defines or its methods assign on `self`."""
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
            elif isinstance(t, ast.Name):
                names.add(t.id)
    return names


def _library_based(module: object, cls: ast.ClassDef) -> bool:
    live = getattr(module, cls.name, None)
    return inspect.isclass(live) and any(
        b is not object and not b.__module__.startswith(package.__name__) and b.__module__ != "typing"
        for b in live.__mro__[1:]
    )


def library_reach(source: str, path: str, module_name: str) -> set[tuple[str, str, str]]:
    """(path, class, name) for each private name a subclass of a library class in `module_name`
    takes from its library base: an override or call of a name the base has, or a `self._x`
    read our class never sets."""
    module = importlib.import_module(module_name)
    found: set[tuple[str, str, str]] = set()
    tree = ast.parse(source)
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    set_anywhere = {name for c in classes if not _library_based(module, c) for name in _set_on_self(c)}
    for cls in classes:
        live = getattr(module, cls.name, None)
        if not inspect.isclass(live):
            continue
        bases = [b for b in live.__mro__[1:] if b is not object and not b.__module__.startswith(package.__name__)]
        if not bases:
            continue
        ours = [c for c in live.__mro__ if c.__module__.startswith(package.__name__)]
        defined = _set_on_self(cls)
        own = defined | {n for c in ours for n in vars(c)} | set_anywhere
        used = {
            n.attr
            for n in ast.walk(cls)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
        } | defined
        for name in (u for u in used if u.startswith("_") and not u.startswith("__")):
            if any(name in vars(b) for b in bases) or name not in own:
                found.add((path, cls.name, name))
    return found


def test_a_subclass_of_a_library_class_reaches_only_the_listed_private_names() -> None:
    found = set()
    for file in sorted(ROOT.rglob("*.py")):
        rel = file.relative_to(ROOT)
        if rel.name == "__main__.py":  # importing it runs the command line
            continue
        name = ".".join((package.__name__, *rel.with_suffix("").parts)).removesuffix(".__init__")
        found |= library_reach(file.read_text(), rel.as_posix(), name)
    assert found == set(LIBRARY_REACH), "a library reach to list, with its reason and version cap, or one gone"


def test_each_library_reach_is_still_where_it_was_checked() -> None:
    from google.cloud import firestore

    from pubsub_filter.backends.stores.firestore import ReconnectingClient

    base = firestore.AsyncClient
    assert isinstance(inspect.getattr_static(base, "_firestore_api"), property)
    assert callable(base._firestore_api_helper) and callable(base._emulator_channel)
    assert list(inspect.signature(base._firestore_api_helper).parameters) == [
        "self",
        "transport",
        "client_class",
        "client_module",
    ]
    from google.auth.credentials import AnonymousCredentials

    client = ReconnectingClient(project="p", credentials=AnonymousCredentials())
    assert hasattr(client, "_emulator_host") and hasattr(client, "_credentials")


def test_the_check_sees_a_library_subclass_reaching_into_its_base() -> None:
    source = (
        "import argparse\n"
        "class P(argparse.ArgumentParser):\n"
        "    def _get_formatter(self):\n"  # overrides the library's private method
        "        self._mine = 1\n"
        "        return self._mine, self._actions\n"  # _actions: set by the library's __init__
    )
    assert library_reach(source, "m.py", "argparse") == set()  # argparse has no class P
    import sys
    import types

    mod = types.ModuleType("filter_probe_mod")
    exec(compile(source, "m.py", "exec"), mod.__dict__)
    sys.modules["filter_probe_mod"] = mod
    try:
        assert library_reach(source, "m.py", "filter_probe_mod") == {
            ("m.py", "P", "_get_formatter"),
            ("m.py", "P", "_actions"),
        }
    finally:
        del sys.modules["filter_probe_mod"]


def test_the_filter_reads_no_private_attribute_of_a_library_object() -> None:
    found = [
        hit
        for file in sorted(ROOT.rglob("*.py"))
        for hit in private_accesses(file.read_text(), file.relative_to(ROOT).as_posix())
    ]
    assert found == []


def test_the_check_sees_private_reads_on_library_objects_and_not_on_our_own() -> None:
    source = (
        "import structlog\n"
        "from pubsub_filter.core import engine\n"
        "class Mine:\n"
        "    def f(self, bound, reader):\n"
        "        self._x = engine._private\n"
        "        super()._receive_metrics(1)\n"
        "        return bound._logger, reader.provider._sdk_config, Mine._y\n"
        "    def g(self, s):\n"
        "        return getattr(s, '_root', None), getattr(self, '_z', None)\n"
    )
    assert private_accesses(source, "m.py") == [
        "m.py:6: super()._receive_metrics",
        "m.py:7: bound._logger",
        "m.py:7: reader.provider._sdk_config",
        "m.py:9: getattr(s, '_root', None)",
    ]
