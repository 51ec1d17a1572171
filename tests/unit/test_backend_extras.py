"""The Firestore and BigQuery clients are extras: the embedded default needs neither, and a config
that picks one without it is refused in one line naming the install, by `check` and by every
command that would build the backend, never with an ImportError at the first message.

The suite's venv has both clients (the test extra pulls in `gcp`); "not installed" is
`sys.modules[name] = None`, which makes both `importlib.util.find_spec` and `import` say the
module is not there. tests/selfcheck/test_image_install.py does the same with a real bare
install of the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pubsub_filter.backends import extras
from pubsub_filter.cli import FAILED, main
from pubsub_filter.core.config.schema import load
from pubsub_filter.core.ports import Failure
from pubsub_filter.runtime import wiring

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = """\
store: {backend: sqlite, path: state.db}
publisher: {backend: outbox, path: outbox.jsonl}
records: {backend: sqlite, path: decisions.db}
routes:
  - name: scores
    destination: scores-changed
    subscription: scores-raw
    key: [payload.game_id]
"""
FIRESTORE_STORE = EMBEDDED.replace("{backend: sqlite, path: state.db}", "{backend: firestore}")
BIGQUERY_RECORDS = EMBEDDED.replace("{backend: sqlite, path: decisions.db}", "{backend: bigquery}")
BOTH = FIRESTORE_STORE.replace("{backend: sqlite, path: decisions.db}", "{backend: bigquery}")

NEEDS_FIRESTORE = (
    "store.backend firestore needs the google-cloud-firestore client, which is not installed: "
    "pip install 'pubsub-filter[firestore]'"
)
NEEDS_BIGQUERY = (
    "records.backend bigquery needs the google-cloud-bigquery client, which is not installed: "
    "pip install 'pubsub-filter[bigquery]'"
)
NEEDS_BOTH = (
    "store.backend firestore and records.backend bigquery need the google-cloud-firestore and "
    "google-cloud-bigquery clients, which are not installed: pip install 'pubsub-filter[gcp]'"
)


def nothing_installed(module: str) -> bool:
    return False


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "filter.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def without_clients(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither the Firestore nor the BigQuery client importable; the working directory a fresh one."""
    for module in ("google.cloud.firestore", "google.cloud.bigquery"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.chdir(tmp_path)


# --- which extra, in which words ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "said"),
    [(FIRESTORE_STORE, [NEEDS_FIRESTORE]), (BIGQUERY_RECORDS, [NEEDS_BIGQUERY]), (BOTH, [NEEDS_BOTH]), (EMBEDDED, [])],
    ids=["firestore", "bigquery", "both", "embedded"],
)
def test_a_backend_without_its_client_is_one_problem_naming_the_install(
    tmp_path: Path, config: str, said: list[str]
) -> None:
    assert extras.missing(load(written(tmp_path, config)), found=nothing_installed) == said


def test_with_the_clients_installed_no_backend_is_a_problem(tmp_path: Path) -> None:
    assert extras.missing(load(written(tmp_path, BOTH))) == []


def test_a_module_under_a_missing_package_is_not_importable() -> None:
    assert not extras.importable("pubsub_filter_no_such_package.firestore")
    assert extras.importable("google.cloud.firestore")


# --- the wiring: where each backend is built --------------------------------------------------


def test_building_a_firestore_store_without_the_client_fails_in_one_line(without_clients: None, tmp_path: Path) -> None:
    with pytest.raises(Failure) as failed:
        wiring.make_store(load(written(tmp_path, FIRESTORE_STORE)))
    assert str(failed.value) == NEEDS_FIRESTORE


def test_building_bigquery_records_or_their_reader_without_the_client_fails_in_one_line(
    without_clients: None, tmp_path: Path
) -> None:
    cfg = load(written(tmp_path, BIGQUERY_RECORDS))
    for build in (wiring.make_recorder, wiring.make_reader):
        with pytest.raises(Failure) as failed:
            build(cfg)
        assert str(failed.value) == NEEDS_BIGQUERY


def test_a_backend_module_imported_without_its_client_names_the_extra() -> None:
    """A library user's `from pubsub_filter import FirestoreFences` in a bare install: the ImportError says the fix."""
    code = (
        "import sys; sys.modules['google.cloud.firestore'] = None\n"
        "try:\n"
        "    from pubsub_filter import FirestoreFences\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.endswith("(the google-cloud-firestore client, not installed: pip install 'pubsub-filter[firestore]')\n")


def test_the_embedded_default_imports_neither_client(tmp_path: Path) -> None:
    """Every surface imported and the embedded engine built: neither client module is loaded."""
    code = f"""
import json, sys
import pubsub_filter.cli, pubsub_filter.push.serve, pubsub_filter.pull.command, pubsub_filter.replay.command
import pubsub_filter.inprocess.api, pubsub_filter.tools.explain, pubsub_filter.tools.plan, pubsub_filter.tools.tune
from pubsub_filter import SqliteFences, SyncFilter
from pubsub_filter.core.config.schema import load
from pubsub_filter.runtime.wiring import make_engine, make_reader
cfg = load({str(ROOT / "examples" / "filter.yaml")!r})
make_engine(cfg), make_reader(cfg)
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("google.cloud.firestore", "google.cloud.bigquery")))))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, cwd=tmp_path
    )
    assert json.loads(proc.stdout.splitlines()[-1]) == []


# --- the commands ------------------------------------------------------------------------------

#: `pubsub-filter ARGS` in a process of its own without either client: `serve` and `replay` set up
#: the process's logging on the stream they are given, which must not be a test's captured one
WITHOUT_CLIENTS = """
import sys
for module in ("google.cloud.firestore", "google.cloud.bigquery"):
    sys.modules[module] = None
from pubsub_filter.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_without_clients(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Nothing set that would let credentials be found or a backend be reached."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "PUBSUB_", "FIRESTORE_", "BIGQUERY_"))}
    env.update(CLOUDSDK_CONFIG=str(cwd / "gcloud"), NO_GCE_CHECK="True")
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_CLIENTS, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=cwd,
        env=env,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["serve", "--config"],
        ["pull", "--config"],
        ["replay", "--project", "demo", "scores-raw-dlq-sub", "--through-filter", "--config"],
    ],
    ids=["check", "serve", "pull", "replay"],
)
def test_a_command_on_a_config_whose_client_is_missing_fails_at_once_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """Before credentials are looked for or a backend is probed: nothing set here would pass those."""
    path = written(tmp_path, BOTH)
    proc = run_without_clients([*command, str(path)], tmp_path)
    assert (proc.returncode, proc.stderr) == (FAILED, f"{path}: {NEEDS_BOTH}\n")


def test_explain_on_a_firestore_config_without_the_client_names_the_extra_before_probing(tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text('{"game_id": 1}', encoding="utf-8")
    proc = run_without_clients(
        ["explain", "--config", str(written(tmp_path, FIRESTORE_STORE)), "-r", "scores", str(payload)], tmp_path
    )
    assert (proc.returncode, proc.stderr) == (FAILED, f"pubsub-filter explain: {NEEDS_FIRESTORE}\n")


def test_skip_rate_on_bigquery_records_without_the_client_names_the_extra(tmp_path: Path) -> None:
    proc = run_without_clients(["skip-rate", "--config", str(written(tmp_path, BIGQUERY_RECORDS))], tmp_path)
    assert (proc.returncode, proc.stderr) == (FAILED, f"pubsub-filter skip-rate: {NEEDS_BIGQUERY}\n")


def test_check_on_the_embedded_examples_passes_without_either_client(
    without_clients: None, capsys: pytest.CaptureFixture[str]
) -> None:
    for example in ("filter.yaml", "inprocess.yaml"):
        assert main(["check", str(ROOT / "examples" / example)]) == 0
        assert ": ok" in capsys.readouterr().out
