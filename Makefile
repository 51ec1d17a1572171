# Two commands do all the set-up on a fresh machine:
#   make serve   — install into .venv and run the filter on the embedded default (port $PORT, default 8080)
#   make test    — install the test extra and run lint, types and every test tier (starts its own emulators),
#                  the bench smoke (tests/selfcheck/test_bench_smoke.py) among them
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/filter.yaml
# What `make serve` and `make test` install is pinned: requirements.lock (the runtime, as the
# image installs it) and requirements-test.lock (the test extra with everything it pulls in, the
# gcp extra among it), both passed to pip as constraints. `make serve` installs no extra: the
# embedded default needs neither the Firestore nor the BigQuery client (`.[gcp]` for those).
# `make test-unpinned` empties the locks to run the suite on the newest versions pyproject.toml
# allows (what `pip install pubsub-filter` gives a user).
LOCK      ?= -c requirements.lock
TEST_LOCK ?= -c requirements-test.lock
# The version, written once in filter/pubsub_filter/_version.py (the wheel, `--version` and the image's label read it)
VERSION   := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' filter/pubsub_filter/_version.py)
# The image's base (Dockerfile ARG PYTHON_IMAGE): pin it by digest, NAME:TAG@sha256:..., for a
# build that is the same every time (infra/README.md, "Pin the base image")
PYTHON_IMAGE ?= python:3.11.13-slim-bookworm

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/pip install -q $(LOCK) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml requirements-test.lock | $(BIN)/python
	$(BIN)/pip install -q $(TEST_LOCK) -e ".[test,chart]"
	$(BIN)/python -c "import duckdb, duckdb_extensions; duckdb_extensions.import_extension('spatial', con=duckdb.connect())"
	touch $@ $(VENV)/.installed

.PHONY: serve test test-unpinned lint unit selfcheck install lock bench-smoke docs fuzz release image
install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(BIN)/pubsub-filter serve --config $(CONFIG)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check filter tests bench
	$(BIN)/ruff format --check filter tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache  # the layers of docs/architecture.md

unit: $(VENV)/.installed-test
	$(BIN)/pytest tests/unit -q

# the slow self-checks: the wheel, the docs site, the bench smoke, instruction counts, the locks
selfcheck: $(VENV)/.installed-test
	$(BIN)/pytest tests/selfcheck -q

# every bench in bench/, one tiny round each (`--smoke`); `make test` runs these too
bench-smoke: $(VENV)/.installed-test
	$(BIN)/pytest tests/selfcheck/test_bench_smoke.py -q

test: lint
	$(BIN)/pytest -q

# The suite (not lint: ruff and mypy stay at the lock's versions) on the newest versions
# pyproject.toml allows, in a venv of its own: run it before bumping the locks.
test-unpinned:
	$(MAKE) unpinned-suite VENV=$(VENV)-unpinned TEST_LOCK= LOCK=

.PHONY: unpinned-suite
unpinned-suite: $(VENV)/.installed-test
	$(BIN)/pip install -q --upgrade --upgrade-strategy eager -e ".[test,chart]"
	$(BIN)/pytest -q

# the push fuzz test with 12,000 examples (the suite runs 3,000): docs/getting-started.md, "Tests"
PUSH_FUZZ_EXAMPLES ?= 12000
fuzz: $(VENV)/.installed-test
	PUSH_FUZZ_EXAMPLES=$(PUSH_FUZZ_EXAMPLES) $(BIN)/pytest tests/faults/test_push_fuzz.py -q -s --timeout 3600

# the documentation site (mkdocs.yml) into site/, strictly, from the docs extra alone in a venv of its
# own (nothing of the test extra); tests/selfcheck/test_docs_site.py builds it in make test
DOCS_VENV ?= $(VENV)-docs
$(DOCS_VENV)/.installed: pyproject.toml requirements-test.lock
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q --upgrade pip
	$(DOCS_VENV)/bin/pip install -q $(TEST_LOCK) -e ".[docs]"
	touch $@

docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

# The release: wheel and sdist into dist/ (the wheel built from the sdist, so the sdist is
# complete), their metadata checked, then the wheel installed alone into a fresh venv with the
# pinned runtime (requirements.lock) and run from outside the source tree: `--version` must be
# $(VERSION) and `check` must accept $(CONFIG). Publish dist/ with `twine upload dist/*`.
RELEASE_VENV ?= $(VENV)-wheel
$(VENV)/.installed-release: pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/pip install -q $(LOCK) -e ".[release]"
	touch $@ $(VENV)/.installed

release: $(VENV)/.installed-release
	rm -rf dist $(RELEASE_VENV)
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(PYTHON) -m venv $(RELEASE_VENV)
	$(RELEASE_VENV)/bin/pip install -q --no-deps -r requirements.lock
	$(RELEASE_VENV)/bin/pip install -q --no-deps dist/pubsub_filter-$(VERSION)-py3-none-any.whl
	$(RELEASE_VENV)/bin/pip check
	cd $$(mktemp -d) && test "$$($(abspath $(RELEASE_VENV))/bin/pubsub-filter --version)" = "pubsub-filter $(VERSION)" \
	  && $(abspath $(RELEASE_VENV))/bin/pubsub-filter check $(abspath $(CONFIG))
	@echo "release $(VERSION): $$(ls dist | tr "\n" " ")"

# The image, labelled with $(VERSION) (the build fails if the wheel says otherwise); to push it
# to Artifact Registry and get its digest use infra/cloudbuild.yaml (infra/README.md, step 1)
image:
	docker build --build-arg VERSION=$(VERSION) --build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) -t pubsub-filter:$(VERSION) .

# The locks, regenerated in throw-away venvs, and what moved: requirements.lock is what
# `pip install ".[gcp]"` resolves for the runtime dependencies with the Firestore and BigQuery
# clients (the image installs exactly these; see the Dockerfile); requirements-test.lock is what `pip install ".[test,chart]"` resolves
# (the test extra's bqemulator caps protobuf below the runtime's newest, so the two differ there).
lock: | $(BIN)/python
	$(BIN)/python .ci/lock.py
