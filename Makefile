# Two entry points for a fresh machine: `make demo` and `make test`. Both set up .venv first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
export VLLM_CPU_KVCACHE_SPACE := 1
export RAY_DEDUP_LOGS := 0

.PHONY: setup demo test test-fast lint bench clean

setup:
	@bash scripts/setup_env.sh

demo: setup
	$(VENV)/bin/coati-relay demo

test: setup
	$(PY) -m pytest tests -q
	$(PY) -m pytest benchmarks -q --benchmark-disable  # each benchmark once: both sides still do the same work

test-fast: setup
	$(PY) -m pytest tests -q -m "not slow"

lint: setup  # ruff: pyflakes, pycodestyle, import order (configuration in pyproject.toml)
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) -m pytest benchmarks -q --benchmark-only

clean:
	rm -rf $(VENV) runs .pytest_cache
