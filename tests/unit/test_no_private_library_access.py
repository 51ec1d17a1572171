"""The filter uses libraries (OpenTelemetry, structlog, Google clients) through their public APIs only.

A private attribute (`x._name`) is read only on our own objects: `self`, `cls`, `super()`, and
names the module itself defines or imports from `filter`. Anything else is a library's
internals, which change without notice between releases.
"""

from __future__ import annotations

import ast
from pathlib import Path

import filter as package

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


def _ours(module: ast.Module) -> set[str]:
    """Names bound in `module` to our own things: its classes, functions and module-level
    assignments, and whatever it imports from `filter`."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("filter"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.asname or alias.name for alias in node.names if alias.name.startswith("filter"))
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
        "from filter.core import engine\n"
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
