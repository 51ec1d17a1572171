"""The deployables agree with the code: Terraform wiring, the decisions schema, the Dockerfile.

The .tf files are parsed with python-hcl2 to check the shape of what they declare. What
Terraform computes from the config (route keys, durations, the timing rules) is evaluated
by Terraform itself: `config.tf` reads only variables, so `terraform console` evaluates
it without providers or network (those tests skip when terraform is not on PATH).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from pubsub_filter.backends.records import bigquery as bq
from pubsub_filter.core.config.schema import load, parse
from pubsub_filter.core.times import parse_duration
from pubsub_filter.tools.provision import plan
from pubsub_filter.tools.subscriptions import DEFAULT_NAME, short_id

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MODULE = INFRA / "modules" / "pubsub-filter"
EXAMPLE_CONFIG = INFRA / "example-config.yaml"
SCHEMA_JSON = MODULE / "decisions_schema.json"
DOCKERFILE = ROOT / "Dockerfile"

TERRAFORM = shutil.which("terraform")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not on PATH")

# The decisions table as the product defines it: (name, type, mode).
DECISION_COLUMNS = [
    ("time", "TIMESTAMP", "REQUIRED"),
    ("route", "STRING", "REQUIRED"),
    ("decision", "STRING", "REQUIRED"),
    ("enforced", "BOOL", "NULLABLE"),
    ("message_id", "STRING", "NULLABLE"),
    ("key", "STRING", "NULLABLE"),
    ("reason", "STRING", "NULLABLE"),
    ("fingerprint", "STRING", "NULLABLE"),
    ("message_fingerprint", "STRING", "NULLABLE"),
    ("previous_fingerprint", "STRING", "NULLABLE"),
    ("destination", "STRING", "NULLABLE"),
    ("published_id", "STRING", "NULLABLE"),
    ("fence", "INT64", "NULLABLE"),
    ("publish_time", "TIMESTAMP", "NULLABLE"),
    ("delivery_attempt", "INT64", "NULLABLE"),
    ("latency_ms", "FLOAT64", "NULLABLE"),
    ("trace", "STRING", "NULLABLE"),
    ("extra", "JSON", "NULLABLE"),
]


# --- reading the .tf files ---------------------------------------------------------------

_META_KEYS = {"__is_block__", "__comments__", "__inline_comments__", "__start_line__", "__end_line__"}


def _unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _plain(node: Any) -> Any:
    """The same shape whichever python-hcl2 produced it (4.x plain strings, 8.x quoted)."""
    if isinstance(node, dict):
        return {_unquote(k): _plain(v) for k, v in node.items() if k not in _META_KEYS}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return _unquote(node)


@cache
def _parse(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    try:
        from hcl2 import SerializationOptions

        options = SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
        data = hcl2.loads(text, serialization_options=options)
    except ImportError:  # python-hcl2 < 8
        data = hcl2.loads(text)
    return _plain(data)


def _blocks(directory: Path, kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.tf")):
        out.extend(_parse(path).get(kind, []))
    return out


def resources(directory: Path = MODULE) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for block in _blocks(directory, "resource"):
        for rtype, named in block.items():
            for name, body in named.items():
                out[(rtype, name)] = body
    return out


def tf_locals(directory: Path = MODULE) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for block in _blocks(directory, "locals"):
        merged.update(block)
    return merged


def variables(directory: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for block in _blocks(directory, "variable"):
        out.update(block)
    return out


def expr(value: Any) -> str:
    """An HCL expression with whitespace removed, for comparisons across parser versions."""
    return re.sub(r"\s+", "", str(value))


def only(block: Any) -> dict[str, Any]:
    """A nested block (a one-element list in the parsed form)."""
    if isinstance(block, list):
        assert len(block) == 1, block
        return block[0]
    return block


# --- evaluating config.tf with Terraform ---------------------------------------------------


def example_config() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE_CONFIG.read_text(encoding="utf-8"))


def evaluate(tmp_path: Path, expression: str, config: dict[str, Any] | None = None, **tfvars: Any) -> Any:
    """Evaluate an expression over the module's config-derived locals with `terraform console`."""
    proc = console(tmp_path, expression, config, **tfvars)
    assert proc.returncode == 0, proc.stderr
    assert "Invalid value for variable" not in proc.stderr, proc.stderr
    return json.loads(json.loads(proc.stdout.strip().splitlines()[-1]))


def refusal(tmp_path: Path, config: dict[str, Any]) -> str:
    """What the module's variable validation says of `config`, unwrapped ("" when it passes).
    Only a variable is evaluated: terraform console crashes on a local once a variable is invalid."""
    proc = console(tmp_path, "var.project", config)
    if "Invalid value for variable" not in proc.stderr:
        return ""
    said = proc.stderr.split("This was checked by the validation rule", 1)[0]
    return " ".join(said.split("var.config_yaml is", 1)[1].split("\n", 1)[1].split())


def console(
    tmp_path: Path, expression: str, config: dict[str, Any] | None = None, **tfvars: Any
) -> subprocess.CompletedProcess[str]:
    cfg = example_config() if config is None else config
    work = tmp_path / f"tf-{len(list(tmp_path.glob('tf-*')))}"
    work.mkdir()
    for name in ("config.tf", "variables.tf", "dashboard.tf"):
        shutil.copy(MODULE / name, work / name)
    values = {
        "project": "test-project",
        "region": "us-west2",
        "image": "example.invalid/pubsub-filter:test",
        "source_topics": {r["name"]: f"raw-{r['name']}" for r in cfg["routes"]},
        "config_yaml": yaml.safe_dump(cfg, sort_keys=False),
        **tfvars,
    }
    (work / "terraform.tfvars.json").write_text(json.dumps(values), encoding="utf-8")
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "TF_INPUT": "0", "CHECKPOINT_DISABLE": "1"}
    # a CLI config file that does not exist only makes terraform print a warning
    if not Path(env.get("TF_CLI_CONFIG_FILE") or Path.home() / ".terraformrc").exists():
        env["TF_CLI_CONFIG_FILE"] = os.devnull
    assert TERRAFORM is not None
    return subprocess.run(
        [TERRAFORM, "console", "-no-color"],
        input=f"jsonencode({expression})\n",
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- the example config ------------------------------------------------------------------


def test_example_config_validates_with_the_filters_own_loader() -> None:
    cfg = load(EXAMPLE_CONFIG)
    assert [r.name for r in cfg.routes] == ["injury-report", "odds-props", "scoreboard"]
    assert (cfg.store.backend, cfg.publisher.backend, cfg.records.backend) == ("firestore", "pubsub", "bigquery")
    assert cfg.auth.audience and cfg.auth.service_account


# --- the embedded backends: refused before anything is deployed ----------------------------------

#: the line Terraform's refusal gives for each embedded part (runtime/durability.py words it for serve)
TF_FIX = {
    "store": "fix: `store: {backend: firestore}`",
    "publisher": "fix: `publisher: {backend: pubsub}`",
    "records": "fix: `records: {backend: bigquery}`",
}
EMBEDDED_BACKEND = {"store": "sqlite", "publisher": "outbox", "records": "sqlite"}
CLOUD_RUN_EXAMPLE = ROOT / "examples" / "cloud-run.yaml"


@needs_terraform
@pytest.mark.parametrize("part", list(TF_FIX))
def test_terraform_refuses_an_embedded_part_with_the_line_that_fixes_it(tmp_path: Path, part: str) -> None:
    said = refusal(tmp_path, {**example_config(), part: {"backend": EMBEDDED_BACKEND[part]}})
    assert said.startswith("The config runs embedded backends, files inside the instance that Cloud Run loses")
    assert [p for p, fix in TF_FIX.items() if fix in said] == [part]
    assert "pubsub-filter check --for cloud-run" in said


@needs_terraform
@pytest.mark.parametrize(
    "sections",
    [{}, {"store": None, "publisher": {"fsync": True}, "records": {"path": "decisions.db"}}],
    ids=["no sections", "sections without a backend"],
)
def test_terraform_takes_a_missing_backend_for_the_embedded_one_as_the_filter_does(
    tmp_path: Path, sections: dict[str, Any]
) -> None:
    cfg = {"routes": example_config()["routes"], **sections}
    loaded = load_text(tmp_path, cfg)
    assert (loaded.store.backend, loaded.publisher.backend, loaded.records.backend) == ("sqlite", "outbox", "sqlite")
    said = refusal(tmp_path, cfg)
    assert all(fix in said for fix in TF_FIX.values()), said


@needs_terraform
def test_terraform_refuses_the_embedded_example(tmp_path: Path) -> None:
    embedded = yaml.safe_load((ROOT / "examples" / "filter.yaml").read_text(encoding="utf-8"))
    assert all(fix in refusal(tmp_path, embedded) for fix in TF_FIX.values())


@needs_terraform
@pytest.mark.parametrize("example", [EXAMPLE_CONFIG, CLOUD_RUN_EXAMPLE], ids=lambda p: p.name)
def test_terraform_takes_the_cloud_run_examples(tmp_path: Path, example: Path) -> None:
    assert refusal(tmp_path, yaml.safe_load(example.read_text(encoding="utf-8"))) == ""


def load_text(tmp_path: Path, cfg: dict[str, Any]) -> Any:
    path = tmp_path / "loaded.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return load(path)


# --- subscription names: Terraform's and provision's ---------------------------------------------


def test_provisions_default_name_is_terraforms() -> None:
    assert variables(MODULE)["name"]["default"] == DEFAULT_NAME
    assert variables(INFRA)["name"]["default"] == DEFAULT_NAME


@needs_terraform
@pytest.mark.parametrize("name", [None, "odds"])
def test_provision_names_each_routes_subscription_and_dead_letters_as_terraform_does(
    tmp_path: Path, name: str | None
) -> None:
    """A route without `subscription` (the Cloud Run example's), with an id, with a full path."""
    cfg = yaml.safe_load(CLOUD_RUN_EXAMPLE.read_text(encoding="utf-8"))
    cfg["routes"][1]["subscription"] = "props-push"
    cfg["routes"][2]["subscription"] = "projects/test-project/subscriptions/scores-push"
    terraform = evaluate(tmp_path, "local.routes", cfg, **({"name": name} if name else {}))
    wanted = plan(
        parse(cfg),
        "test-project",
        push_endpoint="https://pubsub-filter.example.invalid",
        max_delivery_attempts=17,
        source_topics={r["name"]: f"raw-{r['name']}" for r in cfg["routes"]},
        existing_topic_of=lambda _: None,
        name=name or DEFAULT_NAME,
    )
    pushed = {s.route: s for s in wanted.subscriptions if s.route is not None}
    assert {r: short_id(s.path) for r, s in pushed.items()} == {r: t["subscription"] for r, t in terraform.items()}
    assert pushed["injury-report"].path.endswith(f"/{name or 'pubsub-filter'}-injury-report")
    assert {r: short_id(s.dead_letter_topic) for r, s in pushed.items()} == {
        r: t["dead_letter"] for r, t in terraform.items()
    }
    # pubsub.tf names the dead-letter pull subscription "${dead_letter}-sub"
    dead_letter_subscriptions = {short_id(s.path) for s in wanted.subscriptions if s.route is None}
    assert dead_letter_subscriptions == {f"{t['dead_letter']}-sub" for t in terraform.values()}
    assert expr(resources()[("google_pubsub_subscription", "dead_letter")]["name"]) == "${each.value.dead_letter}-sub"


# --- subscriptions -----------------------------------------------------------------------


def test_push_subscriptions_are_declared_per_route_with_oidc_and_dead_letter_policy() -> None:
    push = resources()[("google_pubsub_subscription", "push")]
    assert expr(push["for_each"]) == "${local.routes}"
    routes = expr(tf_locals()["routes"])
    assert routes.startswith("${{forrinlocal.config.routes:r.name=>")
    assert expr(tf_locals()["config"]) == "${yamldecode(var.config_yaml)}"

    push_config = only(push["push_config"])
    assert expr(push_config["push_endpoint"]) == "${google_cloud_run_v2_service.this.uri}/push/${each.key}"
    oidc = only(push_config["oidc_token"])
    assert expr(oidc["service_account_email"]) == "${local.push_sa_email}"
    dead_letter = only(push["dead_letter_policy"])
    assert expr(dead_letter["dead_letter_topic"]) == "${google_pubsub_topic.dead_letter[each.key].id}"
    assert expr(dead_letter["max_delivery_attempts"]) == "${local.max_delivery_attempts}"
    assert expr(push["ack_deadline_seconds"]) == "${local.ack_deadline_seconds}"
    assert set(only(push["retry_policy"])) == {"minimum_backoff", "maximum_backoff"}


def test_root_example_feeds_the_module_the_config_file() -> None:
    module = _blocks(INFRA, "module")[0]["pubsub_filter"]
    assert module["source"] == "./modules/pubsub-filter"
    assert expr(module["config_yaml"]) == "${local.config_yaml}"
    assert expr(tf_locals(INFRA)["config_yaml"]) == "${file(var.config_path)}"
    assert variables(INFRA)["config_path"]["default"] == "example-config.yaml"


@needs_terraform
def test_every_route_in_the_example_config_gets_its_subscription(tmp_path: Path) -> None:
    routes = evaluate(tmp_path, "local.routes")
    cfg = example_config()
    assert sorted(routes) == sorted(r["name"] for r in cfg["routes"])
    for r in cfg["routes"]:
        # the filter rejects pushes from any other subscription than the route's own
        assert routes[r["name"]]["subscription"] == r["subscription"]
        assert routes[r["name"]]["source_topic"] == f"raw-{r['name']}"
        assert routes[r["name"]]["dead_letter"] == f"{routes[r['name']]['subscription']}-dlq"


def test_push_subscriptions_unwrap_the_payload_as_the_routes_push_format_says() -> None:
    push_config = only(resources()[("google_pubsub_subscription", "push")]["push_config"])
    no_wrapper = only(push_config["dynamic"])["no_wrapper"]
    assert expr(no_wrapper["for_each"]) == '${each.value.push_format=="wrapped"?[]:[each.value.push_format]}'
    assert expr(only(no_wrapper["content"])["write_metadata"]) == '${no_wrapper.value=="unwrapped"}'


@needs_terraform
def test_each_routes_push_format_reaches_its_subscription(tmp_path: Path) -> None:
    cfg = example_config()
    formats = {cfg["routes"][0]["name"]: "unwrapped", cfg["routes"][1]["name"]: "unwrapped_no_metadata"}
    for r in cfg["routes"]:
        if r["name"] in formats:
            r["push_format"] = formats[r["name"]]
    routes = evaluate(tmp_path, "local.routes", cfg)
    assert {name: r["push_format"] for name, r in routes.items()} == {
        r["name"]: formats.get(r["name"], "wrapped") for r in cfg["routes"]
    }


def test_oidc_audience_is_the_configs_auth_audience() -> None:
    push = resources()[("google_pubsub_subscription", "push")]
    oidc = only(only(push["push_config"])["oidc_token"])
    assert expr(oidc["audience"]) == "${coalesce(local.auth_audience,google_cloud_run_v2_service.this.uri)}"
    assert expr(tf_locals()["auth_audience"]) == "${try(local.config.auth.audience,null)}"
    service = resources()[("google_cloud_run_v2_service", "this")]
    # Cloud Run only accepts tokens for its URL or a custom audience
    assert "local.auth_audience" in expr(service["custom_audiences"])


@needs_terraform
def test_oidc_audience_evaluates_to_the_example_configs(tmp_path: Path) -> None:
    assert evaluate(tmp_path, "local.auth_audience") == example_config()["auth"]["audience"]


def test_each_dead_letter_topic_has_a_pull_subscription() -> None:
    res = resources()
    topic = res[("google_pubsub_topic", "dead_letter")]
    sub = res[("google_pubsub_subscription", "dead_letter")]
    assert expr(topic["for_each"]) == expr(sub["for_each"]) == "${local.routes}"
    assert expr(sub["topic"]) == "${google_pubsub_topic.dead_letter[each.key].id}"
    assert "push_config" not in sub
    assert only(sub["expiration_policy"])["ttl"] == ""  # never expires while idle


def test_pubsub_service_agent_can_dead_letter_and_mint_push_tokens() -> None:
    res = resources()
    publish = res[("google_pubsub_topic_iam_member", "service_agent_publishes_dead_letter")]
    subscribe = res[("google_pubsub_subscription_iam_member", "service_agent_subscribes_source")]
    tokens = res[("google_service_account_iam_member", "service_agent_mints_push_tokens")]
    assert (publish["role"], subscribe["role"]) == ("roles/pubsub.publisher", "roles/pubsub.subscriber")
    assert tokens["role"] == "roles/iam.serviceAccountTokenCreator"
    agent = expr(tf_locals()["pubsub_service_agent"])
    assert agent == "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
    for binding in (publish, subscribe, tokens):
        assert expr(binding["member"]) == "${local.pubsub_service_agent}"


# --- timing rules ------------------------------------------------------------------------


def _with_lease(**lease: Any) -> dict[str, Any]:
    cfg = example_config()
    cfg["lease"] = lease
    return cfg


@needs_terraform
def test_cloud_run_timeout_is_computed_from_lease_duration(tmp_path: Path) -> None:
    service = resources()[("google_cloud_run_v2_service", "this")]
    assert expr(only(service["template"])["timeout"]) == "${local.request_timeout_seconds}s"
    for lease in ({"duration": "120s"}, {"duration": "15m", "ack_deadline": "300s", "heartbeat": "60s"}):
        got = evaluate(tmp_path, "local.request_timeout_seconds", _with_lease(**lease))
        duration = parse_duration(lease["duration"])
        assert got >= duration
        assert got == min(3600, max(60, math.ceil(duration) + 30))


@needs_terraform
def test_lease_durations_parse_as_the_filter_parses_them(tmp_path: Path) -> None:
    lease = {"duration": "2h", "ack_deadline": "1.5m", "heartbeat": 20}
    got = evaluate(tmp_path, "local.lease", _with_lease(**lease))
    assert got == {k: parse_duration(v) for k, v in lease.items()}


@needs_terraform
def test_ack_deadline_is_the_configs_lease_ack_deadline(tmp_path: Path) -> None:
    cfg = load(EXAMPLE_CONFIG)
    assert evaluate(tmp_path, "local.ack_deadline_seconds") == math.ceil(cfg.lease.ack_deadline)


@needs_terraform
@pytest.mark.parametrize(
    ("duration", "minimum_backoff", "margin", "expected"),
    [
        ("120s", "10s", 5, 12 + 5),  # ceil(120 / 10) + margin
        ("30s", "20s", 5, 2 + 5),
        ("15s", "600s", 1, 5),  # 1 + 1, clamped up to Pub/Sub's minimum
        ("20m", "10s", 5, 100),  # 120 + 5, clamped down to Pub/Sub's maximum
    ],
)
def test_max_delivery_attempts_covers_lease_contention(
    tmp_path: Path, duration: str, minimum_backoff: str, margin: int, expected: int
) -> None:
    cfg = _with_lease(duration=duration, ack_deadline="11s", heartbeat="10s")
    got = evaluate(
        tmp_path,
        "{attempts = local.max_delivery_attempts, floor = local.contention_attempts}",
        cfg,
        minimum_backoff=minimum_backoff,
        delivery_attempts_margin=margin,
    )
    assert got["attempts"] == expected
    assert got["floor"] == math.ceil(parse_duration(duration) / parse_duration(minimum_backoff))


# --- Firestore, BigQuery -----------------------------------------------------------------


def test_firestore_ttl_policy_is_on_the_stores_expiry_field() -> None:
    try:
        from pubsub_filter.backends.stores import TTL_FIELD as expected
    except ImportError:
        expected = "expires_at"
    field = resources()[("google_firestore_field", "ttl")]
    assert expr(field["field"]) == "${local.ttl_field}"
    assert tf_locals()["ttl_field"] == expected
    assert "ttl_config" in field
    assert expr(field["collection"]) == "${local.store_collection}"
    assert expr(field["database"]) == "${local.store_database}"


@needs_terraform
def test_firestore_ttl_collection_and_database_come_from_the_config(tmp_path: Path) -> None:
    got = evaluate(tmp_path, "[local.store_collection, local.store_database]")
    assert got == [example_config()["store"]["collection"], example_config()["store"]["database"]]
    default = example_config()
    default["store"] = {"backend": "firestore"}
    assert evaluate(tmp_path, "[local.store_collection, local.store_database]", default) == [
        "pubsub-filter",
        "(default)",
    ]


def fields_the_store_writes() -> set[str]:
    """The top-level fields of a key's document, as the Firestore store writes it: a document
    with every optional part present, plus the dotted field paths its updates name."""
    from pubsub_filter.backends.stores import firestore as store
    from pubsub_filter.core.model import KeyState, Lease

    full = KeyState(
        fingerprint="f",
        forwarded_at=1.0,
        message_id="m",
        publish_time=1.0,
        recent=(("m", "f"),),
        fence=1,
        lease=Lease(holder="h", fence=1, expires_at=2.0, fingerprint="f", message_id="m"),
        expires_at=3.0,
        rows=b"r",
        full_fingerprint="g",
    )
    written = set(store.to_document("route", "key", full))
    assert {name for _, name in store._FIELDS} <= written  # what commits and claims update
    source = Path(store.__file__).read_text(encoding="utf-8")
    dotted = {m.group(1) for m in re.finditer(r'"([a-z_]+)\.[a-z_.]+":', source)}  # e.g. "lease.expires_at"
    return written | dotted


def test_every_field_the_firestore_store_writes_is_exempt_from_indexing() -> None:
    # Firestore indexes every field by default; the store reads by document id only, and an
    # indexed monotonically increasing field caps a collection near 500 writes/s.
    fields = resources()[("google_firestore_field", "unindexed")]
    assert "local.store_unindexed_fields" in expr(fields["for_each"])
    assert expr(fields["field"]) == "${each.key}"
    assert expr(fields["collection"]) == "${local.store_collection}"
    assert only(fields["index_config"]) == {}  # empty: no index at all
    ttl = resources()[("google_firestore_field", "ttl")]
    assert only(ttl["index_config"]) == {}
    exempt = {*tf_locals()["store_unindexed_fields"], tf_locals()["ttl_field"]}
    assert exempt == fields_the_store_writes()


@needs_terraform
@pytest.mark.parametrize("manage_ttl", [True, False])
def test_the_ttl_field_is_exempt_whether_or_not_terraform_manages_its_policy(tmp_path: Path, manage_ttl: bool) -> None:
    for_each = expr(resources()[("google_firestore_field", "unindexed")]["for_each"])
    assert for_each.startswith("${") and for_each.endswith("}")
    config = {**example_config(), "store": {"backend": "firestore"}}
    exempt = set(evaluate(tmp_path, for_each[2:-1], config, manage_firestore_ttl=manage_ttl))
    with_policy = {"expires_at"} if manage_ttl else set()  # the ttl resource's own index_config
    assert exempt | with_policy == fields_the_store_writes()
    # no Firestore, no fields: a config with the SQLite state is refused at plan
    sqlite = {**example_config(), "store": {"backend": "sqlite"}}
    assert TF_FIX["store"] in refusal(tmp_path, sqlite)


def test_bigquery_table_is_partitioned_by_time_and_clustered_by_route_and_decision() -> None:
    table = resources()[("google_bigquery_table", "decisions")]
    partitioning = only(table["time_partitioning"])
    assert (partitioning["type"], partitioning["field"]) == ("DAY", "time")
    assert expr(partitioning["expiration_ms"]) == "${local.records_partition_expiration_days*86400000}"
    assert table["clustering"] == ["route", "decision"]
    assert expr(table["schema"]) == '${file("${path.module}/decisions_schema.json")}'


def test_one_dataset_resource_holds_the_records_dataset_and_the_decision_lines_dataset_each_when_asked_for(
    tmp_path: Path,
) -> None:
    dataset = resources()[("google_bigquery_dataset", "dataset")]
    assert expr(dataset["for_each"]) == "${local.datasets}"
    assert dataset["delete_contents_on_destroy"] is False
    bigquery = example_config()
    bigquery["records"] = {"backend": "bigquery", "dataset": "decisions_ds"}
    # records in SQLite (no dataset of their own) are refused at plan (the tests above)
    assert evaluate(tmp_path, "keys(local.datasets)", config=bigquery) == ["records"]
    both = evaluate(tmp_path, "local.datasets", config=bigquery, decision_log_sink=True, name="odds")
    assert sorted(both) == ["decision_lines", "records"]
    assert (both["records"]["dataset_id"], both["decision_lines"]["dataset_id"]) == (
        "decisions_ds",
        "odds_decision_lines",
    )


def test_the_optional_decision_line_sink_sends_every_decision_line_to_a_dataset_its_writer_may_write() -> None:
    """What a SIGKILL or OOM kill can cost the batched rows, the lines (written before each
    answer, kept by Cloud Logging) cannot: the sink takes every `decision` line of the service."""
    found = resources()
    gated = [key for key in found if key[1] in ("decision_lines", "decision_lines_writer")]
    assert sorted(gated) == [
        ("google_bigquery_dataset_iam_member", "decision_lines_writer"),
        ("google_logging_project_sink", "decision_lines"),
    ]
    for key in gated:
        assert expr(found[key]["count"]) == "${var.decision_log_sink?1:0}", key
    sink = found[("google_logging_project_sink", "decision_lines")]
    assert expr(sink["filter"]) == expr('${local.log_source} AND jsonPayload.message="decision"')
    assert 'google_bigquery_dataset.dataset["decision_lines"].dataset_id' in expr(sink["destination"])
    assert sink["unique_writer_identity"] is True
    assert only(sink["bigquery_options"])["use_partitioned_tables"] is True
    writer = found[("google_bigquery_dataset_iam_member", "decision_lines_writer")]
    assert (writer["role"], expr(writer["member"])) == (
        "roles/bigquery.dataEditor",
        "${google_logging_project_sink.decision_lines[0].writer_identity}",
    )
    assert variables(MODULE)["decision_log_sink"]["default"] is False
    module = _blocks(INFRA, "module")[0]["pubsub_filter"]
    assert expr(module["decision_log_sink"]) == "${var.decision_log_sink}"


def test_decisions_schema_json_has_the_decision_columns() -> None:
    schema = json.loads(SCHEMA_JSON.read_text(encoding="utf-8"))
    assert [(c["name"], c["type"], c.get("mode", "NULLABLE")) for c in schema] == DECISION_COLUMNS


def test_decisions_schema_json_matches_the_python_recorder() -> None:
    schema = json.loads(SCHEMA_JSON.read_text(encoding="utf-8"))
    ours = [(c["name"], c["type"], c.get("mode", "NULLABLE")) for c in schema]
    theirs = [(f.name, f.field_type, f.mode or "NULLABLE") for f in bq.SCHEMA]
    assert ours == theirs
    assert bq.CLUSTERING == ["route", "decision"]


# --- documentation of the interface ------------------------------------------------------


@pytest.mark.parametrize("directory", [INFRA, MODULE], ids=["root", "module"])
def test_every_variable_has_a_description_and_a_type(directory: Path) -> None:
    declared = variables(directory)
    assert declared
    missing = {n for n, v in declared.items() if not v.get("description") or not v.get("type")}
    assert not missing


# --- the Dockerfile ----------------------------------------------------------------------


def _final_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the last stage, continuation lines joined."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    instructions = [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def test_dockerfile_final_stage_runs_as_a_non_root_user() -> None:
    users = [args.strip() for op, args in _final_stage() if op == "USER"]
    assert users, "the final stage never sets USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_dockerfile_entrypoint_and_cmd_are_exec_form() -> None:
    stage = dict(_final_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["pubsub-filter"]
    assert json.loads(stage["CMD"]) == ["serve"]


def test_dockerfile_final_stage_copies_only_the_venv_from_the_builder() -> None:
    stage = _final_stage()
    base = stage[0][1]
    # the base is the PYTHON_IMAGE build argument (pinned by digest at build time): its default
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(encoding="utf-8"), re.MULTILINE))
    base = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], base)
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base), base
    copies = [args for op, args in stage if op == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    assert not [args for op, args in stage if op == "RUN" and re.search(r"pip|apt-get|gcc", args)]
    assert "[test]" not in DOCKERFILE.read_text(encoding="utf-8")


def test_dockerfile_sets_the_config_path_and_python_env() -> None:
    env = " ".join(args for op, args in _final_stage() if op == "ENV")
    assert "PUBSUB_FILTER_CONFIG=/etc/pubsub-filter/filter.yaml" in env
    assert "PYTHONUNBUFFERED=1" in env and "PYTHONDONTWRITEBYTECODE=1" in env
    service = resources()[("google_cloud_run_v2_service", "this")]
    container = only(only(service["template"])["containers"])
    env_names = {e["name"] for e in container["env"]}
    assert "PUBSUB_FILTER_CONFIG" in env_names


# --- the dashboard -------------------------------------------------------------------------


@needs_terraform
def test_dashboard_has_the_tiles_the_operator_needs_one_skip_rate_per_route(tmp_path: Path) -> None:
    dashboard = evaluate(tmp_path, "local.dashboard")
    titles = [t["widget"]["title"] for t in dashboard["mosaicLayout"]["tiles"]]
    routes = {r["name"]: r.get("mode", "enforce") for r in example_config()["routes"]}
    assert "shadow" in routes.values()  # the example exercises the marking
    skip_rate = [
        f"Skip rate: {name} (shadow: would have skipped)" if mode == "shadow" else f"Skip rate: {name}"
        for name, mode in routes.items()
    ]
    assert titles == [
        *skip_rate,
        "Decision latency p50 / p95 (ms)",
        "Decisions by type",
        "Lease takeovers",
        "Heartbeat failures",
        "Fail-open forwards (store unreachable)",
        "Decision records dropped",
    ]


@needs_terraform
def test_dashboard_tiles_read_metrics_the_module_declares(tmp_path: Path) -> None:
    dashboard = evaluate(tmp_path, "local.dashboard", name="pf")
    declared = {"pf/decisions", "pf/decision_latency"} | {f"pf/{m}" for m in tf_locals()["event_metrics"]}
    filters = json.dumps(dashboard)
    used = set(re.findall(r"logging.googleapis.com/user/([a-z0-9_/-]+)", filters))
    assert used and used <= declared
    assert resources()[("google_monitoring_dashboard", "this")]["dashboard_json"] == "${jsonencode(local.dashboard)}"


@needs_terraform
def test_dashboard_latency_is_p50_and_p95_of_the_latency_distribution(tmp_path: Path) -> None:
    dashboard = evaluate(tmp_path, "local.dashboard")
    [tile] = [t for t in dashboard["mosaicLayout"]["tiles"] if t["widget"]["title"].startswith("Decision latency")]
    reducers = [
        d["timeSeriesQuery"]["timeSeriesFilter"]["aggregation"]["crossSeriesReducer"]
        for d in tile["widget"]["xyChart"]["dataSets"]
    ]
    assert reducers == ["REDUCE_PERCENTILE_50", "REDUCE_PERCENTILE_95"]


# --- alerts -------------------------------------------------------------------------------


def alert(name: str) -> dict[str, Any]:
    return resources()[("google_monitoring_alert_policy", name)]


def condition(name: str) -> dict[str, Any]:
    return only(only(alert(name)["conditions"])["condition_threshold"])


def test_each_routes_dead_letter_backlog_is_alerted_on() -> None:
    assert expr(alert("dead_letter_backlog")["for_each"]) == "${local.routes}"
    c = condition("dead_letter_backlog")
    assert "pubsub.googleapis.com/subscription/num_undelivered_messages" in c["filter"]
    # the pull subscription on the dead-letter topic, `<subscription>-dlq-sub`
    assert "${google_pubsub_subscription.dead_letter[each.key].name}" in c["filter"]
    assert expr(c["threshold_value"]) == "${var.dead_letter_backlog_threshold}"
    assert (
        "pubsub-filter replay --config filter.yaml --route ${each.key}"
        in only(alert("dead_letter_backlog")["documentation"])["content"]
    )


def test_each_source_subscriptions_oldest_unacked_message_age_is_alerted_on() -> None:
    assert expr(alert("oldest_unacked_age")["for_each"]) == "${local.routes}"
    c = condition("oldest_unacked_age")
    assert "pubsub.googleapis.com/subscription/oldest_unacked_message_age" in c["filter"]
    assert "${google_pubsub_subscription.push[each.key].name}" in c["filter"]
    assert expr(c["threshold_value"]) == "${var.oldest_unacked_age_threshold_seconds}"


@pytest.mark.parametrize(
    ("name", "metric"), [("publish_failures", "publish_failures"), ("store_unavailable", "store_unavailable")]
)
def test_publish_failures_and_store_unavailability_are_alerted_on_their_log_based_metrics(
    name: str, metric: str
) -> None:
    assert metric in tf_locals()["event_metrics"]
    c = condition(name)
    assert f'google_logging_metric.events["{metric}"].name' in c["filter"]
    assert expr(c["threshold_value"]) == f"${{var.{name}_threshold}}"


NEW_THRESHOLDS = [
    "dead_letter_backlog_threshold",
    "oldest_unacked_age_threshold_seconds",
    "publish_failures_threshold",
    "store_unavailable_threshold",
]


@pytest.mark.parametrize("name", NEW_THRESHOLDS)
def test_alert_thresholds_are_variables_the_root_example_passes_on(name: str) -> None:
    assert expr(variables(MODULE)[name]["type"]) in ("number", "${number}")  # as python-hcl2 versions write it
    assert name in variables(INFRA)
    assert expr(_blocks(INFRA, "module")[0]["pubsub_filter"][name]) == f"${{var.{name}}}"


# --- quieted decision lines (the config's decision_logs) -------------------------------------
#
# The dashboard and the alerts count decision lines with log-based metrics. A line the filter
# quiets is written at DEBUG; the module then runs the service at LOG_LEVEL=debug and excludes
# its DEBUG entries from Cloud Logging's storage. Cloud Logging computes user-defined
# log-based metrics from every entry it receives, excluded or not, so they keep counting
# every decision: provided no metric filter names a severity.


def log_based_metric_filters() -> dict[str, str]:
    """Every log-based metric's filter, the event metrics' matches written out."""
    declared = {
        name: str(body["filter"]) for (rtype, name), body in resources().items() if rtype == "google_logging_metric"
    }
    events = declared.pop("events")
    out = {
        f"events[{name}]": events.replace("${each.value.match}", str(m["match"]))
        for name, m in tf_locals()["event_metrics"].items()
    }
    return {**declared, **out}


def test_no_log_based_metric_filter_names_a_severity_so_debug_lines_count() -> None:
    filters = log_based_metric_filters()
    assert {"decisions", "decision_latency", "events[fail_open]", "events[contention]"} <= set(filters)
    assert {name: f for name, f in filters.items() if "severity" in f.lower()} == {}


def test_alerts_and_dashboard_read_only_log_based_metrics_or_pubsubs_own() -> None:
    for (rtype, name), body in resources().items():
        if rtype != "google_monitoring_alert_policy":
            continue
        c = only(only(body["conditions"])["condition_threshold"])
        for f in (c["filter"], c.get("denominator_filter", "")):
            if f:
                assert "${local.user_metric_prefix}/${google_logging_metric." in f or "pubsub.googleapis.com/" in f, (
                    name
                )
    # the dashboard: test_dashboard_tiles_read_metrics_the_module_declares
    assert "logging.googleapis.com/user/${var.name}/${m}" in str(tf_locals()["dashboard_metric"])


def test_decisions_the_alerts_count_one_by_one_are_never_quieted() -> None:
    from pubsub_filter.core.config.sections import LOUD_DECISIONS, DecisionLogs

    named = {
        d
        for m in tf_locals()["event_metrics"].values()
        for d in re.findall(r'jsonPayload.decision=\\?"(\w+)\\?"', str(m["match"]))
    }
    assert named == {"contended", "fail_open", "failed"}
    assert named <= set(LOUD_DECISIONS)
    assert not set(LOUD_DECISIONS) & set(DecisionLogs.model_fields)


def test_debug_lines_are_excluded_from_storage_only_when_decision_lines_are_quieted() -> None:
    exclusion = resources()[("google_logging_project_exclusion", "debug_lines")]
    assert expr(exclusion["count"]) == "${length(local.decision_lines_quieted)>0?1:0}"
    assert expr(exclusion["filter"]) == expr("${local.log_source} AND severity=DEBUG")
    [service] = [b for (t, _), b in resources().items() if t == "google_cloud_run_v2_service"]
    container = only(only(service["template"])["containers"])
    [log_level] = [d["env"] for d in container["dynamic"] if "env" in d]
    assert expr(log_level["for_each"]) == "${local.service_log_level==null?[]:[local.service_log_level]}"
    assert only(log_level["content"])["name"] == "LOG_LEVEL"


QUIETINGS: list[dict[str, Any] | None] = [
    None,
    {},
    {"suppressed": None},
    {"suppressed": {"level": "debug"}},
    {"suppressed": {"sample": 0.01}, "duplicate": {"sample": 1}, "noise_only": {"level": "info"}},
    {"forwarded": {"level": "warning", "sample": 0.5}, "stale": {"level": "debug", "sample": 1.0}},
]


@needs_terraform
@pytest.mark.parametrize("quieting", QUIETINGS)
def test_terraform_finds_the_lines_the_filter_writes_at_debug(tmp_path: Path, quieting: dict[str, Any] | None) -> None:
    from pubsub_filter.core.config.schema import parse

    cfg = {**example_config(), "decision_logs": quieting}
    at_debug = sorted(
        name for name, q in parse(cfg).decision_logs.quieting().items() if q.level == "debug" or q.sample < 1
    )
    found = evaluate(tmp_path, "[local.decision_lines_quieted, local.service_log_level]", config=cfg)
    assert found == [at_debug, "debug" if at_debug else None]


def test_every_log_line_a_metric_or_alert_matches_is_one_the_filter_writes() -> None:
    """A metric matching a line the code no longer writes counts nothing, and its alert never fires."""
    source = "\n".join(p.read_text() for p in (ROOT / "filter" / "pubsub_filter").rglob("*.py"))
    matched = set()
    for tf in MODULE.glob("*.tf"):
        matched |= set(re.findall(r'jsonPayload\.message=\\"([a-z_]+)\\"', tf.read_text()))
    assert matched, "no log line matched: the pattern above no longer fits the .tf files"
    unwritten = sorted(m for m in matched if f'"{m}"' not in source)
    assert unwritten == []
