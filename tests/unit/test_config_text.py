"""Every string a config can carry is text every writer takes, or `check` refuses it.

A lone surrogate (`"\\ud800"` in a double-quoted YAML string, or in code) is not UTF-8: as a
`changed_attributes` name it made every forward's decision line fail to encode (a 500 on every
keyed push), the publish fail (`UnicodeEncodeError`), and the records writer drop the rows. A
config file refuses it on its line, a config built in code at its key. And a writer that meets
such text anyway (a record, a log line) writes it escaped, never losing the row or the line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pubsub_filter.backends.records.bigquery import to_row
from pubsub_filter.backends.records.extra import encode_extra
from pubsub_filter.backends.records.sqlite import SqliteSink
from pubsub_filter.core.config.schema import ConfigError, load, parse
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import Decision, DecisionRecord
from tests.support.jsonlogs import production_logs
from tests.support.push_client import engine_on_sqlite, push_client

LONE = "\ud800x"
BASE: dict[str, Any] = {"name": "r", "destination": "phase3", "key": ["payload.k"]}


@pytest.mark.parametrize(
    ("line", "yaml"),
    [
        (5, '    changed_attributes: ["\\ud800x", "s"]'),
        (5, '    tolerance: {"p\\udfff": 5}'),
        (5, '    include: ["\\ud83d"]'),
        (5, '    bypass: {field: payload.live, equals: "\\udc80"}'),
    ],
)
def test_check_refuses_a_lone_surrogate_in_a_file_on_its_line(tmp_path: Path, line: int, yaml: str) -> None:
    path = tmp_path / "filter.yaml"
    path.write_text(f"routes:\n  - name: r\n    destination: phase3\n    key: [payload.k]\n{yaml}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load(path)
    (problem,) = caught.value.found
    assert problem.position is not None and problem.position.line == line
    assert problem.text.startswith("'") and "lone surrogate" in problem.text


def test_parse_refuses_a_lone_surrogate_at_its_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"routes": [{**BASE, "changed_attributes": [LONE, "s"], "exclude": {"a": 1} and ["\udc00"]}]})
    assert [p.split(":")[0] for p in str(caught.value).splitlines()] == ["<config>", "<config>"]
    assert "route 'r': changed_attributes[0]: '\\ud800x' holds a lone surrogate" in str(caught.value)
    assert "route 'r': exclude[0]:" in str(caught.value)


def record(**text: str) -> DecisionRecord:
    return DecisionRecord(
        1.0, "r", Decision.FORWARDED, True, "m", key=text.get("key", "k"), reason=text.get("reason", "new key"),
        details={"changed_flagged": [text.get("flag", "s")]},
    )  # fmt: skip


@pytest.mark.parametrize("rows", [1, 3])
def test_a_record_with_text_utf8_cannot_write_is_stored_escaped(tmp_path: Path, rows: int) -> None:
    sink = SqliteSink(tmp_path / "d.db")
    sink.insert([record(key=LONE, reason="r\udfff", flag=LONE)] + [record()] * (rows - 1))
    stored = sqlite3.connect(tmp_path / "d.db").execute("SELECT key, reason, extra FROM decisions").fetchall()
    assert stored[0] == ("\\ud800x", "r\\udfff", '{"changed_flagged":["\\\\ud800x"]}')
    assert len(stored) == rows


def test_a_group_of_records_with_one_such_row_stores_every_row(tmp_path: Path) -> None:
    from pubsub_filter.backends.records.sqlite import prepared

    sink = SqliteSink(tmp_path / "d.db")
    assert sink.insert_apart([prepared(record()), prepared(record(key=LONE)), prepared(record())]) == []
    keys = [k for (k,) in sqlite3.connect(tmp_path / "d.db").execute("SELECT key FROM decisions")]
    assert keys == ["k", "\\ud800x", "k"]


def test_a_bigquery_row_carries_such_text_escaped() -> None:
    row = to_row(record(key=LONE, flag=LONE))
    assert row["key"] == "\\ud800x" and json.loads(row["extra"]) == {"changed_flagged": ["\\ud800x"]}
    json.dumps(row, ensure_ascii=False).encode("utf-8")  # what the client sends: valid UTF-8
    assert encode_extra({"a": LONE}) == '{"a":"\\\\ud800x"}'


def test_a_decision_line_with_such_text_is_written_escaped() -> None:
    from pubsub_filter.core.engine.record import log_decision

    with production_logs() as logs:
        log_decision(record(key=LONE, flag=LONE))
    assert logs.lines == 1 and not logs.bad and not logs.tracebacks


# --- the property: `check` refuses the config, or the engine decides without a 5xx ------------

EXAMPLES = itertools.count()

#: Any text, lone surrogates included (`st.characters()` leaves category Cs out).
TEXT = st.lists(
    st.one_of(st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)), min_size=1, max_size=6
).map("".join)


def route_with(texts: list[str]) -> dict[str, Any]:
    flag, tolerated, included, value = texts
    return {
        **BASE,
        "changed_attributes": [flag, "s"] if flag != "s" else ["s"],
        "tolerance": {tolerated: 5} if tolerated not in ("s", flag) else {},
        "exclude": [included] if included not in (flag, tolerated, "s") else [],
        "bypass": {"field": "payload.live", "equals": value},
    }


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(TEXT, min_size=4, max_size=4))
def test_any_config_text_is_refused_or_decided_without_a_5xx(tmp_path: Path, texts: list[str]) -> None:
    config = {"routes": [route_with(texts)]}
    try:
        parse(config)
    except ConfigError:
        return  # refused by check: never served

    scratch = tmp_path / str(next(EXAMPLES))  # each example on fresh state
    scratch.mkdir()

    async def push_three() -> list[int]:
        engine = engine_on_sqlite(scratch, config)
        sink = SqliteSink(scratch / "records.db")
        async with push_client(engine) as client:
            codes = []
            for n, body in enumerate([{"k": 1, "s": 1, **{t: 1 for t in texts}}, {"k": 1, "s": 2}, {"s": 3}]):
                r = await client.post("/push/r", content=make_envelope(json.dumps(body).encode(), f"m{n}"))
                codes.append(r.status_code)
        recorder: Any = engine.recorder
        sink.insert(list(recorder.records))
        await engine.store.close()
        return codes

    with production_logs() as logs:
        codes = asyncio.run(push_three())
    assert all(c < 500 for c in codes), codes
    assert not logs.bad and not logs.tracebacks


def test_a_config_nested_past_the_recursion_limit_is_checked_for_its_text_not_crashed() -> None:
    from pubsub_filter.core.config.rules import rules

    deep: object = "\ud800x"
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]
    problems = rules({"routes": [], "deep": deep})
    assert [msg for _, msg in problems if "surrogate" in msg]


def test_a_config_that_holds_itself_through_a_yaml_alias_is_checked_once(tmp_path: Path) -> None:
    path = tmp_path / "filter.yaml"
    path.write_text("loop: &a [*a]\nroutes: []\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        load(path)
