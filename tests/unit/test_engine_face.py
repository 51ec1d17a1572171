"""The surfaces call the engine only through its face (`Engine.FACE`).

Push, pull, replay, the in-process API, the wiring and the probes decide messages, ask for
health, problems and the work under way, note their events, decide what is held and stop; and
they read the few facts they need from one immutable value (`Engine.facts`). Everything else
on an engine (its config, rules, store, publisher, recorder, counters) is the engine's own:
a module outside `core.engine` that reads it fails here.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.engine.facts import Facts, RouteFacts
from tests.support.fakes import MemoryPublisher, MemoryRecorder

PACKAGE = Path(__file__).resolve().parents[2] / "filter" / "pubsub_filter"
ENGINE_ROOM = PACKAGE / "core" / "engine"


def _is_engine(node: ast.expr) -> bool:
    """`engine` or `<anything>.engine`: how the package names an engine it holds."""
    return (isinstance(node, ast.Name) and node.id == "engine") or (
        isinstance(node, ast.Attribute) and node.attr == "engine"
    )


def engine_reads(root: Path, outside: Path) -> list[tuple[str, int, str]]:
    """(file, line, name) for every attribute read or set on an engine, in the modules under
    `root` but outside `outside`: `engine.x`, `self.engine.x`, `getattr(engine, "x")`."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        if path.is_relative_to(outside):
            continue
        where = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and _is_engine(node.value):
                found.append((where, node.lineno, node.attr))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and node.args
                and _is_engine(node.args[0])
            ):
                name = node.args[1] if len(node.args) > 1 else None
                found.append((where, node.lineno, name.value if isinstance(name, ast.Constant) else "<computed>"))
    return found


def test_no_module_outside_the_engine_reads_an_engine_past_its_face() -> None:
    reads = engine_reads(PACKAGE, ENGINE_ROOM)
    assert reads, "the scan found no use of an engine at all: it no longer sees the surfaces"
    past = [f"{where}:{line}: engine.{name}" for where, line, name in reads if name not in Engine.FACE]
    assert not past, "read past the engine's face (add to Engine.FACE only what a surface must have):\n" + "\n".join(
        past
    )


def test_the_scan_sees_a_reach_past_the_face(tmp_path: Path) -> None:
    surface = """
def serve(engine, worker):
    engine.handle
    worker.engine.config.server
    getattr(engine, 'rules')
"""
    (tmp_path / "surface.py").write_text(surface.lstrip())
    reads = engine_reads(tmp_path, tmp_path / "core" / "engine")
    assert sorted((line, name) for _, line, name in reads) == [(2, "handle"), (3, "config"), (4, "rules")]


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    routes = [
        {"name": "reports", "destination": "out", "key": ["payload.id"], "push_format": "unwrapped_no_metadata"},
        {"name": "kept", "destination": "out", "key": ["payload.id"], "cache_result": True},
    ]
    cfg = parse({"routes": routes, "server": {"max_body": 4096, "body_timeout": "3s"}, "lease": {"ack_deadline": 30}})
    return Engine(cfg, SqliteStore(tmp_path / "state.db"), MemoryPublisher(), MemoryRecorder(), instance="i-1")


def test_every_name_of_the_face_is_on_an_engine(engine: Engine) -> None:
    assert all(hasattr(engine, name) for name in Engine.FACE)


def test_the_facts_are_the_configs_as_one_immutable_value(engine: Engine) -> None:
    facts = engine.facts
    assert facts == Facts(
        instance="i-1",
        routes={
            "reports": RouteFacts(push_format="unwrapped_no_metadata", cache_result=False),
            "kept": RouteFacts(push_format="wrapped", cache_result=True),
        },
        max_body=4096,
        max_bytes_in_flight=engine.config.server.max_bytes_in_flight,
        admission_wait=2.0,
        body_timeout=3.0,
        shutdown_budget=engine.config.server.shutdown_budget,
        ack_deadline=30.0,
        lease_duration=engine.config.lease.duration,
        pull=engine.config.pull,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.max_body = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        facts.routes["other"] = RouteFacts("wrapped", False)  # type: ignore[index]
