"""What the Docker image does, without Docker: wheel -> fresh venv -> `pubsub-filter serve`.

The wheel is built from exactly the files the image's build context holds (the
.dockerignore allow-list: requirements.lock, pyproject.toml, README.md, LICENSE, filter/) and
installed as the image installs it: the pinned runtime dependencies of requirements.lock
first, then the wheel with --no-deps, `pip check`ed, then its gcp extra from what is already
there alone, into a new venv that, as in the image, holds no pip or setuptools. The installed
console script must then serve a push end to end on $PORT and exit 0 on SIGTERM. Every
module of the package must import there, and every backend of the config reference must be
constructible from a config through the project's own wiring, so a dependency that only the
test extra brings in fails here, not in the Cloud Run image.
Dependencies come from the package index pip is configured with (its cache makes repeat
runs fast).

The same wheel installed bare (`pip install pubsub-filter`: the runtime dependencies alone, no
extra) must serve the embedded default, and say in one line which extra a Firestore or
BigQuery config needs.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
BUILD_CONTEXT = ("requirements.lock", "pyproject.toml", "README.md", "LICENSE", "filter")
LOCK = ROOT / "requirements.lock"
DOCKERFILE = ROOT / "Dockerfile"

MINIMAL_CONFIG = """\
routes:
  - name: injury-report
    destination: phase3-injury
    key: [payload.game_id]
    rows: payload.players
    row_key: [player_lookup]
    exclude: [processed_at, scrape_time]
"""

# Every Google backend of the config reference, as production configures them.
GOOGLE_CONFIG = """\
project: fake-project
store: {backend: firestore, database: "(default)", collection: pubsub-filter}
publisher: {backend: pubsub, timeout: 30s}
records: {backend: bigquery, dataset: pubsub_filter, table: decisions, location: us-west2}
auth:
  audience: https://filter.example.test
  service_account: push@fake-project.iam.gserviceaccount.com
routes:
  - name: injury-report
    destination: phase3-injury
    key: [payload.game_id]
"""

# The embedded backends (sqlite store, outbox, sqlite records), named explicitly.
EMBEDDED_CONFIG = """\
store: {backend: sqlite, path: state.db}
publisher: {backend: outbox, path: outbox.jsonl}
records: {backend: sqlite, path: decisions.db}
routes:
  - name: injury-report
    destination: phase3-injury
    key: [payload.game_id]
"""

# Run by the venv's own python: import every module of the installed package, then build
# each config's backends with pubsub_filter.runtime.wiring (and the authenticator as `serve` does) and
# close them again. Prints one JSON object; a failure is reported, not raised, so the test
# can name every missing piece at once.
PROBE = """\
import asyncio, importlib, json, pkgutil, sys, traceback
import pubsub_filter

report = {"file": pubsub_filter.__file__, "modules": [], "import_errors": {}, "built": {}, "build_errors": {}}
# pubsub_filter.__main__ runs the CLI when imported; the test runs `python -m pubsub_filter --help` instead.
for info in pkgutil.walk_packages(pubsub_filter.__path__, "pubsub_filter."):
    if info.name == "pubsub_filter.__main__":
        continue
    report["modules"].append(info.name)
    try:
        importlib.import_module(info.name)
    except BaseException:
        report["import_errors"][info.name] = traceback.format_exc(limit=-3)

from pubsub_filter.core.config.schema import load
from pubsub_filter.runtime.wiring import make_publisher
from pubsub_filter.runtime.wiring import make_recorder
from pubsub_filter.runtime.wiring import make_store
from pubsub_filter.push.auth import PushAuthenticator


async def build(path):
    cfg = load(path)
    store, publisher, recorder = make_store(cfg), make_publisher(cfg), make_recorder(cfg)
    built = {"store": type(getattr(store, "inner", store)).__name__, "publisher": type(publisher).__name__,
             "records": type(getattr(recorder, "sink", recorder)).__name__}
    if cfg.auth.audience:
        auth = PushAuthenticator(audience=cfg.auth.audience, service_account=cfg.auth.service_account,
                                 issuers=tuple(cfg.auth.issuers), certs_url=cfg.auth.certs_url)
        built["auth"] = type(auth).__name__
    await recorder.close(deadline=5)
    await publisher.close()
    await store.close()
    return built


for path in sys.argv[1:]:
    try:
        report["built"][path] = asyncio.run(build(path))
    except BaseException:
        report["build_errors"][path] = traceback.format_exc(limit=-5)
print(json.dumps(report))
"""

# Variables that would point the served process at something other than its own files.
_FOREIGN_ENV = ("PUBSUB_", "FIRESTORE_", "BIGQUERY_", "GOOGLE_", "PORT", "HOST", "PYTHON")


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding only the project wheel and its runtime dependencies; returns its bin/."""
    base = tmp_path_factory.mktemp("image")
    context = base / "context"
    context.mkdir()
    for name in BUILD_CONTEXT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, context / name)

    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # The image builds in an isolated environment; the wheel is the same without one,
    # and reusing this interpreter's setuptools saves a download.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    _run([*pip, "wheel", *isolation, "--no-deps", "--wheel-dir", str(wheels), str(context)], timeout=300)
    (wheel,) = wheels.glob("pubsub_filter-*.whl")

    # Like the image's venv once built: the locked dependencies, then the project without
    # resolving any, checked; no pip, no setuptools. This interpreter's pip installs into it.
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    into = [*pip, "--python", str(bin_dir / "python")]
    _run([*into, "install", "--no-deps", "-r", str(context / "requirements.lock")], timeout=600)
    _run([*into, "install", "--no-deps", str(wheel)], timeout=300)
    _run([*into, "check"], timeout=120)
    version = wheel.name.split("-")[1]
    _run([*into, "install", "--no-index", "--find-links", str(wheels), f"pubsub-filter[gcp]=={version}"], timeout=300)
    (bin_dir / "wheel-name").write_text(wheel.name, encoding="utf-8")
    return bin_dir


@pytest.fixture(scope="module")
def bare(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the same wheel as `pip install pubsub-filter` would: its runtime dependencies
    alone (resolved by pip, held to the lock's versions), no extra; returns its bin/."""
    (wheel,) = (installed.parent.parent / "wheels").glob("pubsub_filter-*.whl")
    env_dir = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    into = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(bin_dir / "python")]
    _run([*into, "install", "-c", str(LOCK), str(wheel)], timeout=600)
    _run([*into, "check"], timeout=120)
    return bin_dir


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post_json(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, cwd: Path, log: Path) -> None:
        self.proc, self.port, self.cwd, self.log = proc, port, cwd, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_healthy(self, deadline: float) -> None:
        def healthy() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited {self.proc.returncode} before it was healthy:\n{self.output()}")
            try:
                status, _ = _get(f"{self.url}/healthz")
            except OSError:
                return False
            return status == 200

        wait_until(healthy, deadline - time.monotonic(), lambda: f"/healthz did not answer 200:\n{self.output()}")


def _serve(bin_dir: Path, tmp_path: Path) -> Iterator[Served]:
    """`pubsub-filter serve` of `bin_dir` on the embedded default, on a free port; killed after."""
    cwd = tmp_path / "run"
    cwd.mkdir()
    config = cwd / "filter.yaml"
    config.write_text(MINIMAL_CONFIG, encoding="utf-8")
    port = _free_port()
    env = _clean_env()
    env.update(PORT=str(port), HOST="127.0.0.1", PYTHONUNBUFFERED="1")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "pubsub-filter"), "serve", "--config", str(config)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Served(proc, port, cwd, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def served(installed: Path, tmp_path: Path) -> Iterator[Served]:
    yield from _serve(installed, tmp_path)


@pytest.fixture
def served_bare(bare: Path, tmp_path: Path) -> Iterator[Served]:
    yield from _serve(bare, tmp_path)


def test_console_script_from_the_wheel_runs(installed: Path) -> None:
    proc = _run([str(installed / "pubsub-filter"), "--help"], timeout=60)
    assert "serve" in proc.stdout


def test_the_wheel_and_its_console_script_say_the_version_written_in_filter_version_py(installed: Path) -> None:
    from pubsub_filter._version import __version__

    assert (installed / "wheel-name").read_text(encoding="utf-8").startswith(f"pubsub_filter-{__version__}-")
    proc = _run([str(installed / "pubsub-filter"), "--version"], timeout=60, env=_clean_env(), cwd=installed)
    assert proc.stdout == f"pubsub-filter {__version__}\n"
    (dist_info,) = (installed.parent / "lib").glob("python3.*/site-packages/pubsub_filter-*.dist-info")
    metadata = (dist_info / "METADATA").read_text(encoding="utf-8")
    assert f"\nVersion: {__version__}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "Apache License" in (dist_info / "licenses" / "LICENSE").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def probed(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the probe found in the runtime-only venv, for the example and reference configs."""
    cwd = tmp_path_factory.mktemp("probe")
    configs = {
        "google": cwd / "google.yaml",
        "embedded": cwd / "embedded.yaml",
    }
    configs["google"].write_text(GOOGLE_CONFIG, encoding="utf-8")
    configs["embedded"].write_text(EMBEDDED_CONFIG, encoding="utf-8")
    paths = [str(p) for p in configs.values()] + [str(ROOT / "infra" / "example-config.yaml")]
    # Emulator hosts on a port nothing listens on: the Google clients build with anonymous
    # credentials and no lookup of default credentials or the metadata server.
    unused = f"127.0.0.1:{_free_port()}"
    env = _clean_env()
    env.update(
        PUBSUB_EMULATOR_HOST=unused,
        FIRESTORE_EMULATOR_HOST=unused,
        BIGQUERY_EMULATOR_HOST=f"http://{unused}",
        GOOGLE_CLOUD_PROJECT="fake-project",
    )
    proc = _run([str(installed / "python"), "-c", PROBE, *paths], cwd=cwd, env=env, timeout=120)
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["paths"] = {name: str(p) for name, p in configs.items()} | {"example": paths[-1]}
    return report


def test_the_probe_imports_the_installed_package_not_the_source_tree(probed: dict[str, Any]) -> None:
    assert "site-packages" in probed["file"], probed["file"]


def test_every_module_of_the_package_imports_with_runtime_dependencies_only(probed: dict[str, Any]) -> None:
    source = {
        ".".join(p.relative_to(ROOT / "filter").with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "filter" / "pubsub_filter").rglob("*.py")
    } - {"pubsub_filter", "pubsub_filter.__main__"}
    assert set(probed["modules"]) == source
    assert probed["import_errors"] == {}, "\n".join(probed["import_errors"].values())


def test_python_dash_m_filter_runs(installed: Path) -> None:
    proc = _run([str(installed / "python"), "-m", "pubsub_filter", "--help"], timeout=60, env=_clean_env())
    assert "serve" in proc.stdout


def test_every_backend_of_the_config_reference_builds_from_config(probed: dict[str, Any]) -> None:
    assert probed["build_errors"] == {}, "\n".join(probed["build_errors"].values())
    built = probed["built"]
    assert built[probed["paths"]["google"]] == {
        "store": "FirestoreStore",
        "publisher": "PubsubPublisher",
        "records": "BigQuerySink",
        "auth": "PushAuthenticator",
    }
    assert built[probed["paths"]["embedded"]] == {
        "store": "SqliteStore",
        "publisher": "OutboxPublisher",
        "records": "SqliteSink",
    }


def test_the_production_example_config_builds_its_backends(probed: dict[str, Any]) -> None:
    assert probed["build_errors"] == {}, "\n".join(probed["build_errors"].values())
    assert probed["built"][probed["paths"]["example"]]["records"] == "BigQuerySink"


def test_installed_service_forwards_a_push_on_port_and_exits_0_on_sigterm(served: Served) -> None:
    _forwards_a_push_and_exits_0_on_sigterm(served)


def _forwards_a_push_and_exits_0_on_sigterm(served: Served) -> None:
    served.wait_healthy(deadline=time.monotonic() + 60)

    payload = {
        "game_id": "0022400561",
        "players": [
            {"player_lookup": "lebronjames", "injury_status": "questionable", "processed_at": "2024-01-01T10:00:00Z"}
        ],
        "scrape_time": "2024-01-01T09:58:00Z",
    }
    envelope = {
        "message": {
            "data": base64.b64encode(json.dumps(payload).encode()).decode(),
            "attributes": {"source": "nbac_injury_report"},
            "messageId": "1",
            "publishTime": "2024-01-01T00:00:00Z",
        },
        "subscription": "projects/p/subscriptions/s",
    }
    status, body = _post_json(f"{served.url}/push/injury-report", envelope)
    assert status == 200, (body, served.output())
    assert body["decision"] == "forwarded", body

    served.proc.send_signal(signal.SIGTERM)
    try:
        code = served.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"serve did not exit within 30 s of SIGTERM:\n{served.output()}")
    assert code == 0, served.output()


# --- the bare install: no extra, the embedded default ----------------------------------------

#: the modules that are the Firestore and BigQuery backends, and the extra each needs
EXTRA_MODULES = {
    "pubsub_filter.backends.stores.firestore": "firestore",
    "pubsub_filter.backends.stores.firestore_wire": "firestore",
    "pubsub_filter.consumer.stores.firestore": "firestore",
    "pubsub_filter.backends.records.bigquery": "bigquery",
}
FIRESTORE_ONLY = EMBEDDED_CONFIG.replace("store: {backend: sqlite, path: state.db}", "store: {backend: firestore}")
BIGQUERY_ONLY = EMBEDDED_CONFIG.replace(
    "records: {backend: sqlite, path: decisions.db}", "records: {backend: bigquery}"
)


def _command(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pubsub-filter ARGS` of `bin_dir`, in `cwd`, its exit code left to the caller."""
    return subprocess.run(
        [str(bin_dir / "pubsub-filter"), *args],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture(scope="module")
def probed_bare(bare: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the probe found in the bare venv, for the embedded and the Google configs."""
    cwd = tmp_path_factory.mktemp("probe-bare")
    (cwd / "google.yaml").write_text(GOOGLE_CONFIG, encoding="utf-8")
    (cwd / "embedded.yaml").write_text(EMBEDDED_CONFIG, encoding="utf-8")
    proc = _run([str(bare / "python"), "-c", PROBE, "google.yaml", "embedded.yaml"], cwd=cwd, env=_clean_env())
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def test_a_bare_install_has_neither_the_firestore_nor_the_bigquery_client(bare: Path) -> None:
    found = "import importlib.util as u; print([u.find_spec(f'google.cloud.{m}') for m in ('firestore', 'bigquery')])"
    assert _run([str(bare / "python"), "-c", found], env=_clean_env()).stdout == "[None, None]\n"
    assert _run([str(bare / "python"), "-c", "import google.cloud.pubsub_v1"], env=_clean_env())


def test_a_bare_install_imports_every_module_but_the_google_backends_which_name_their_extra(
    probed_bare: dict[str, Any],
) -> None:
    assert "site-packages" in probed_bare["file"], probed_bare["file"]
    errors = probed_bare["import_errors"]
    assert set(errors) == set(EXTRA_MODULES), "\n".join(errors.values())
    for module, name in EXTRA_MODULES.items():
        assert f"pip install 'pubsub-filter[{name}]'" in errors[module], errors[module]


def test_a_bare_install_builds_the_embedded_backends_and_refuses_a_google_one_in_one_line(
    probed_bare: dict[str, Any],
) -> None:
    assert probed_bare["built"]["embedded.yaml"] == {
        "store": "SqliteStore",
        "publisher": "OutboxPublisher",
        "records": "SqliteSink",
    }
    refused = probed_bare["build_errors"]["google.yaml"].strip().splitlines()[-1]
    assert refused == (
        "pubsub_filter.core.ports.Failure: store.backend firestore needs the google-cloud-firestore client, "
        "which is not installed: pip install 'pubsub-filter[firestore]'"
    )


def test_a_bare_install_checks_the_embedded_examples(bare: Path, tmp_path: Path) -> None:
    for example in ("filter.yaml", "inprocess.yaml"):
        proc = _command(bare, tmp_path, "check", str(ROOT / "examples" / example))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"{ROOT / 'examples' / example}: ok"), proc.stdout


def test_a_bare_install_serves_the_embedded_default(served_bare: Served) -> None:
    _forwards_a_push_and_exits_0_on_sigterm(served_bare)


@pytest.mark.parametrize(
    ("config", "needs", "name"),
    [
        pytest.param(FIRESTORE_ONLY, "store.backend firestore needs the google-cloud-firestore client", "firestore"),
        pytest.param(BIGQUERY_ONLY, "records.backend bigquery needs the google-cloud-bigquery client", "bigquery"),
    ],
    ids=["firestore", "bigquery"],
)
def test_a_bare_install_says_in_one_line_which_extra_a_google_backend_needs(
    bare: Path, tmp_path: Path, config: str, needs: str, name: str
) -> None:
    """`check` refuses the config, and `serve` and `pull` refuse to start, before any credentials are looked for."""
    path = tmp_path / "filter.yaml"
    path.write_text(config, encoding="utf-8")
    for command in (["check", str(path)], ["serve", "--config", str(path)], ["pull", "--config", str(path)]):
        proc = _command(bare, tmp_path, *command)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        assert proc.stderr == f"{path}: {needs}, which is not installed: pip install 'pubsub-filter[{name}]'\n", (
            command,
            proc.stderr,
        )


def test_a_bare_install_names_the_gcp_extra_for_the_cloud_run_example(bare: Path, tmp_path: Path) -> None:
    example = ROOT / "examples" / "cloud-run.yaml"
    proc = _command(bare, tmp_path, "check", str(example))
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr == (
        f"{example}: store.backend firestore and records.backend bigquery need the google-cloud-firestore and "
        "google-cloud-bigquery clients, which are not installed: pip install 'pubsub-filter[gcp]'\n"
    )


def test_the_image_install_checks_the_cloud_run_example(installed: Path, tmp_path: Path) -> None:
    example = ROOT / "examples" / "cloud-run.yaml"
    proc = _command(installed, tmp_path, "check", str(example))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{example}: ok"), proc.stdout


# --- the dependency lock and the Dockerfile's layers -----------------------------------------


def locked(lock: Path = LOCK) -> dict[str, Version]:
    """A lock (requirements.lock by default) as {canonical name: pinned version}; every line must be an exact pin."""
    pins: dict[str, Version] = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==" and not req.extras and not req.marker, f"not an exact pin: {line}"
        pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def _project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def extra(name: str) -> list[Requirement]:
    """What the extra `name` requires, its references to the project's other extras
    (`pubsub-filter[firestore,bigquery]`) replaced by what those require."""
    project = _project()
    found: list[Requirement] = []
    for line in project["optional-dependencies"][name]:
        req = Requirement(line)
        if canonicalize_name(req.name) == canonicalize_name(project["name"]):
            found += [r for other in sorted(req.extras) for r in extra(other)]
        else:
            found.append(req)
    return found


def runtime_dependencies() -> list[Requirement]:
    """What the image installs: pyproject.toml's dependencies and its gcp extra (requirements.lock pins both)."""
    return [*(Requirement(d) for d in _project()["dependencies"]), *extra("gcp")]


def test_the_lock_pins_every_runtime_dependency_within_pyprojects_specifiers() -> None:
    pins = locked()
    wanted = runtime_dependencies()
    assert {"google-cloud-firestore", "google-cloud-bigquery"} <= {r.name for r in wanted}
    missing = [str(r) for r in wanted if canonicalize_name(r.name) not in pins]
    outside = [
        f"{r.name}=={pins[canonicalize_name(r.name)]} is outside {r.specifier}"
        for r in wanted
        if canonicalize_name(r.name) in pins
        and not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    ]
    assert not missing, f"requirements.lock lacks {missing}: run `make lock`"
    assert not outside, "requirements.lock: " + "; ".join(outside) + " (run `make lock`)"


def test_the_lock_holds_no_test_or_build_tool_and_not_the_project_itself() -> None:
    pins = locked()
    assert not {"pytest", "mypy", "ruff", "pip", "setuptools", "wheel", "pubsub-filter"} & set(pins)


def _builder_stage() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the builder stage, continuation lines joined."""
    joined = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    instructions = [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]
    froms = [i for i, (op, _) in enumerate(instructions) if op == "FROM"]
    (start,) = [i for i in froms if instructions[i][1].endswith(" AS builder")]
    end = min([i for i in froms if i > start], default=len(instructions))
    return instructions[start:end]


def test_the_image_installs_the_locked_dependencies_in_a_layer_before_the_source_is_copied() -> None:
    stage = _builder_stage()

    def first(predicate: Any) -> int:
        return next(i for i, step in enumerate(stage) if predicate(*step))

    copy_lock = first(lambda op, args: op == "COPY" and args.split() == ["requirements.lock", "./"])
    install_lock = first(lambda op, args: op == "RUN" and "-r requirements.lock" in args)
    copy_source = first(lambda op, args: op == "COPY" and ("filter" in args.split() or "pyproject.toml" in args))
    assert copy_lock < install_lock < copy_source, stage
    assert all(op != "COPY" for op, _ in stage[copy_lock + 1 : install_lock]), "only the lock keys the layer"
    lock_run = stage[install_lock][1]
    assert "--no-deps" in lock_run, "the lock is complete: nothing else may be resolved"
    wheel_run = next(args for op, args in stage[copy_source:] if op == "RUN" and "pubsub_filter-" in args)
    assert "--no-deps" in wheel_run and "pip check" in wheel_run, wheel_run


def test_the_image_adds_the_gcp_extra_from_the_locked_dependencies_alone() -> None:
    (wheel_run,) = [args for op, args in _builder_stage() if op == "RUN" and "pubsub_filter-" in args]
    installs = [cmd.strip() for cmd in wheel_run.split("&&") if "pip install" in cmd]
    assert len(installs) == 2, installs
    extra = installs[1]
    assert '"pubsub-filter[gcp]==${VERSION}"' in extra and "--no-index" in extra, extra


def test_the_build_context_lets_the_lock_in() -> None:
    allowed = {ln.strip() for ln in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()}
    assert {"*", "!requirements.lock", "!pyproject.toml", "!README.md", "!LICENSE", "!filter/"} <= allowed
