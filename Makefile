# Two commands do all the set-up on a fresh machine:
#   make demo   creates .venv, installs quantune, tunes the bundled digits example
#   make test   creates .venv, installs quantune with its test extras, runs the tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export ORT_DISABLE_TELEMETRY := 1

.PHONY: demo test lint install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"

demo: install
	$(BIN)/quantune run examples/digits/config.yaml --output runs/digits

test: install-test
	$(BIN)/python -m pytest -q

lint: install-test
	$(BIN)/ruff check src tests examples bench
	$(BIN)/ruff format --check src tests examples bench

clean:
	rm -rf runs .quantune-cache
