# Engram's two commands: `make up` runs Engram, `make test` runs every test.
# Both create the virtual environment on first use.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PGTAP  := .cache/pgtap/usr/share/postgresql/15/extension/pgtap.sql

.PHONY: up test venv pgtap assets lint typecheck clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch first: a later dependency on torch would pull a CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

$(PGTAP):
	bash .ci/fetch-pgtap.sh

pgtap: $(PGTAP)

# The console's browser assets (htmx, Chart.js; axe-core for its browser tests) from npm,
# pinned by package-lock.json; node_modules/ and the copies are never committed.
VENDOR := orchestrator/console/static/vendor
ASSETS := $(VENDOR)/.installed-$(shell cat package-lock.json | sha256sum | cut -c1-12)

$(ASSETS): package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing: install Node.js (Debian: apt-get install npm) to build the console's assets"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/chart.js/dist/chart.umd.min.js $(VENDOR)/
	touch $(ASSETS)

assets: $(ASSETS)

up: venv assets
	$(BIN)/engram up

test: venv pgtap assets
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache node_modules $(VENDOR)
