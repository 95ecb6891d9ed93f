# Engram's two commands: `make up` runs Engram, `make test` runs every test.
# Both create the virtual environment on first use.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PGTAP  := .cache/pgtap/usr/share/postgresql/15/extension/pgtap.sql

.PHONY: up test venv pgtap lint typecheck clean

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

up: venv
	$(BIN)/engram up

test: venv pgtap
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
