# Two commands do all the set-up on a fresh machine:
#   make serve   — install into .venv and run the filter on the embedded default (port $PORT, default 8080)
#   make test    — install the test extra and run lint, types and every test tier (starts its own emulators),
#                  the bench smoke (tests/unit/test_bench_smoke.py) among them
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= examples/filter.yaml

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[test,chart]"
	$(BIN)/python -c "import duckdb, duckdb_extensions; duckdb_extensions.import_extension('spatial', con=duckdb.connect())"
	touch $@ $(VENV)/.installed

.PHONY: serve test lint unit install lock bench-smoke docs fuzz
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

# every bench in bench/, one tiny round each (`--smoke`); `make test` runs these too
bench-smoke: $(VENV)/.installed-test
	$(BIN)/pytest tests/unit/test_bench_smoke.py -q

test: lint
	$(BIN)/pytest -q

# the push fuzz test with 12,000 examples (the suite runs 3,000): docs/getting-started.md, "Tests"
PUSH_FUZZ_EXAMPLES ?= 12000
fuzz: $(VENV)/.installed-test
	PUSH_FUZZ_EXAMPLES=$(PUSH_FUZZ_EXAMPLES) $(BIN)/pytest tests/faults/test_push_fuzz.py -q -s --timeout 3600

# the documentation site (mkdocs.yml) into site/, strictly; tests/unit/test_docs_site.py builds it in make test
docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict --site-dir site

# requirements.lock: what `pip install .` resolves for the runtime dependencies, in a
# throw-away venv (the image installs exactly these; see the Dockerfile).
lock: | $(BIN)/python
	rm -rf $(VENV)-lock
	$(PYTHON) -m venv $(VENV)-lock
	$(VENV)-lock/bin/pip install -q .
	{ sed -n '/^#/p' requirements.lock; \
	  $(VENV)-lock/bin/pip freeze --exclude-editable | grep -vi '^pubsub.filter'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock
	rm -rf $(VENV)-lock
