# Two entry points for a fresh machine: `make demo` and `make test`. Both set up .venv first (idempotent).
# CUDA hosts add `make test-gpu`, which sets up .venv-gpu (CUDA builds) and runs the tests marked gpu.
VENV ?= .venv
PY := $(VENV)/bin/python
VENV_GPU ?= .venv-gpu
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
export VLLM_CPU_KVCACHE_SPACE := 1
export RAY_DEDUP_LOGS := 0

.PHONY: setup setup-gpu demo test test-fast test-gpu lint bench clean

setup:
	@bash scripts/setup_env.sh

demo: setup
	$(VENV)/bin/coati-relay demo

test: setup  # two at a time (pytest-xdist), but the tests marked timed (bounds in seconds, memory slopes): one at a time
	$(PY) -m pytest tests -q -n 2 --ignore=tests/e2e --durations=10
	$(PY) -m pytest tests/e2e -q -n 2 --dist loadfile -m "not timed" --durations=15  # a file's runs share its fixtures
	$(PY) -m pytest tests/e2e -q -m timed --durations=10
	$(PY) -m pytest benchmarks -q --benchmark-disable -n 2 --dist loadfile  # each benchmark once: a smoke run

test-fast: setup
	$(PY) -m pytest tests -q -m "not slow"

setup-gpu:
	@VENV_GPU=$(VENV_GPU) bash scripts/setup_env_gpu.sh

test-gpu:  # tests/gpu (docs/contributing.md "GPU test lane") in .venv-gpu on a CUDA host; elsewhere they run in .venv and skip
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory setup-gpu && $(VENV_GPU)/bin/python -m pytest tests/gpu -m gpu -q -rs; \
	else \
	  echo "[test-gpu] no NVIDIA GPU here: the lane's tests are collected and skip (-rs says why)"; \
	  $(MAKE) --no-print-directory setup && $(PY) -m pytest tests/gpu -m gpu -q -rs; \
	fi

lint: setup  # ruff: pyflakes, pycodestyle, import order (configuration in pyproject.toml)
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) -m pytest benchmarks -q --benchmark-only

clean:
	rm -rf $(VENV) $(VENV_GPU) runs .pytest_cache
