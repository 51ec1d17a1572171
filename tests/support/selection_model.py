"""The engine model's selection changes: random histories of messages on a whole-payload and a
rows route whose selection a config deploy changes mid-history (fields excluded and compared
again, `new_fields: forward` and `adopt`, the key read from another field and back), driven
through the real `Engine` on a shared store, against a reference model of the rules written
from the docs ("Changing a route's selection"), not from `pubsub_filter.core.compare.reselect`.

After every message it checks:

- the decision is the model's (forwarded or suppressed), and a decision taken against a last
  forward judged under another selection never says `content changed`;
- a message is suppressed only if it equals the content last forwarded for its key (what the
  destination holds, read back from what was published) on every field the route compares now,
  or, under `new_fields: adopt` against a forward made under another selection, on every field
  both selections compare;
- no change is lost: a message that differs from what the destination holds on a field that
  both the route and its key's last forward compared is forwarded;
- the destination's content for a key is what was last forwarded for it (nothing published
  twice, nothing out of order).

A history A, B, A (each differing on a compared field) forwards all three whatever selections
were deployed in between: the second A differs from B, what the destination holds.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from pubsub_filter.core.attributes import ATTR_ROUTE
from pubsub_filter.core.config.schema import Config, parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.model import Decision, Message
from pubsub_filter.core.ports import StateStore
from tests.support.fakes import MemoryPublisher, MemoryRecorder

STEPS: Counter[str] = Counter()
#: What the histories reached, per backend: the suite checks every path was taken.
REACHED: Counter[str] = Counter()

FIELDS = ("a", "b", "c")
KEYS = ("x", "y")
#: The deployable selections: the fields excluded (the rest of `FIELDS` compared)
EXCLUDES: tuple[tuple[str, ...], ...] = ((), ("c",), ("b", "c"), ("a",))
#: The key: read from `k`, or from `k2` (the same values: the same state, another keyspace)
KEY_FIELDS = ("k", "k2")
ROUTES = ("whole", "rows")


def config(exclude: tuple[str, ...], key_field: str, new_fields: str) -> Config:
    common = {"key": [f"payload.{key_field}"], "exclude": list(exclude), "new_fields": new_fields}
    return parse(
        {
            "routes": [
                {"name": "whole", "destination": "out-whole", **common},
                {
                    "name": "rows",
                    "destination": "out-rows",
                    **common,
                    "rows": "payload.rows",
                    "row_key": ["id"],
                },
            ],
            "store_errors": {"timeout": "10s", "budget": "20s"},
        }
    )


Content = tuple[int, int, int]  # the values of FIELDS


def payload(route: str, key: str, content: Content) -> bytes:
    values = dict(zip(FIELDS, content, strict=True))
    if route == "whole":
        return json.dumps({"k": key, "k2": key, **values}).encode()
    rows = [{"id": 1, **values}, {"id": 2, "a": 0, "b": 0, "c": 0}]
    return json.dumps({"k": key, "k2": key, "rows": rows}).encode()


def content_of(route: str, data: bytes) -> Content:
    body = json.loads(data)
    values = body if route == "whole" else body["rows"][0]
    return tuple(values[f] for f in FIELDS)  # type: ignore[return-value]


@dataclass(frozen=True)
class Deployed:
    exclude: tuple[str, ...]
    key_field: str
    new_fields: str

    @property
    def compared(self) -> frozenset[str]:
        return frozenset(f for f in FIELDS if f not in self.exclude)


@dataclass
class Last:
    """What the model knows of a key's last forward: its content and the selection it was judged under."""

    content: Content
    compared: frozenset[str]
    key_field: str


def _equal(a: Content, b: Content, on: frozenset[str]) -> bool:
    return all(a[i] == b[i] for i, f in enumerate(FIELDS) if f in on)


class SelectionModel:
    """The docs' rules over (route, key) → the last forward."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], Last] = {}

    def judge(self, route: str, key: str, content: Content, now: Deployed) -> tuple[Decision, str]:
        """The decision and which rule took it."""
        last = self.last.get((route, key))
        if last is None:
            return Decision.FORWARDED, "new key"
        if last.key_field != now.key_field:
            return Decision.FORWARDED, "key changed"
        if last.compared == now.compared:
            same = _equal(content, last.content, now.compared)
            return (Decision.SUPPRESSED, "unchanged") if same else (Decision.FORWARDED, "changed")
        both = now.compared & last.compared
        if not _equal(content, last.content, both):
            return Decision.FORWARDED, "changed under another selection"
        if now.compared - last.compared and now.new_fields == "forward":
            return Decision.FORWARDED, "widened, forwarded once"
        if now.compared - last.compared:
            return Decision.SUPPRESSED, "widened, adopted"
        return Decision.SUPPRESSED, "narrowed, unchanged"

    def forwarded(self, route: str, key: str, content: Content, now: Deployed) -> None:
        self.last[(route, key)] = Last(content, now.compared, now.key_field)


#: Builds the store for one run: scratch dir → the store the engines share.
StoreFactory = Callable[[Path], StateStore]


class SelectionMachine(RuleBasedStateMachine):
    """Subclassed per backend with `backend` and `make_store` set."""

    backend = "sqlite"
    make_store: StoreFactory

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="selection-model-"))
        self.store = type(self).make_store(self.dir)
        self.publisher = MemoryPublisher()
        self.recorder = MemoryRecorder()
        self.model = SelectionModel()
        self.n = 0
        self.deploy_config(Deployed((), "k", "forward"))

    def deploy_config(self, deployed: Deployed) -> None:
        self.deployed = deployed
        cfg = config(deployed.exclude, deployed.key_field, deployed.new_fields)
        self.engine = Engine(cfg, self.store, self.publisher, self.recorder)

    def teardown(self) -> None:
        self.loop.run_until_complete(self.store.close())  # type: ignore[attr-defined]
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        exclude=st.sampled_from(EXCLUDES),
        key_field=st.sampled_from(KEY_FIELDS),
        new_fields=st.sampled_from(("forward", "adopt")),
        # a key change is rarer than a selection change: most histories keep the key
        keep_key=st.booleans(),
    )
    def deploy(self, exclude: tuple[str, ...], key_field: str, new_fields: str, keep_key: bool) -> None:
        self.deploy_config(Deployed(exclude, self.deployed.key_field if keep_key else key_field, new_fields))

    @rule(
        route=st.sampled_from(ROUTES),
        key=st.sampled_from(KEYS),
        content=st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)),
    )
    def send(self, route: str, key: str, content: Content) -> None:
        STEPS[self.backend] += 1
        expected, why = self.model.judge(route, key, content, self.deployed)
        REACHED[why] += 1
        before = self.model.last.get((route, key))
        held = self.destination(route, key)
        self.n += 1
        msg = Message(payload(route, key, content), {}, f"m{self.n}")
        rec = self.loop.run_until_complete(self.engine.handle(route, msg)).record
        assert rec.decision is expected, (why, rec.decision, rec.reason)
        reselected = before is not None and before.compared != self.deployed.compared
        if reselected and before is not None and before.key_field == self.deployed.key_field:
            assert rec.reason != "content changed", rec.reason
            assert rec.reason is not None and rec.reason.startswith("selection changed"), rec.reason
        if rec.decision is Decision.SUPPRESSED:
            # suppressed only if equal to what the destination holds as the new selection compares it
            assert held is not None
            on = self.deployed.compared
            if reselected and self.deployed.new_fields == "adopt" and before is not None:
                on = on & before.compared
            assert _equal(content, held, on), (content, held, on)
        elif before is not None and before.key_field == self.deployed.key_field and held is not None:
            both = self.deployed.compared & before.compared
            if not _equal(content, held, both):
                assert rec.decision is Decision.FORWARDED  # no change lost
        if rec.decision is Decision.FORWARDED:
            self.model.forwarded(route, key, content, self.deployed)
            assert self.destination(route, key) == content  # what was just published is what it holds

    def destination(self, route: str, key: str) -> Content | None:
        """The content the destination holds for the key: the last one published for it."""
        for p in reversed(self.publisher.published):
            if p.attributes.get(ATTR_ROUTE) == route and json.loads(p.data)["k"] == key:
                return content_of(route, p.data)
        return None
