"""It runs here too: a legacy script migrated with ``--target colossalchat`` trains on this engine, on CPU, as written
(the import line that ColossalChat needs changed is left as it is), from the legacy prompt CSV."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coati_compat.migrate import migrate_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_colossalchat_migration_trains_here(tiny_model_path, tmp_path):
    from coati_relay.toy import write_toy_dataset

    csv_path = write_toy_dataset(tmp_path / "prompts.csv", num_prompts=8, fmt="csv")
    script = tmp_path / "ppo_many_roles_cc.py"
    script.write_text(migrate_file(ROOT / "examples" / "legacy" / "ppo_many_roles.py", target="colossalchat").script)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_ADDRESS="local", RAY_DEDUP_LOGS="0")
    done = subprocess.run(
        [sys.executable, str(script), "--pretrain", tiny_model_path, "--prompt_path", str(csv_path),
         "--experience_batch_size", "4", "--train_batch_size", "4", "--update_steps", "1", "--prompt_tokens", "96",
         "--max_length", "104", "--num_generations", "2", "--lr", "1e-4", "--inference_backend", "transformers",
         "--save_dir", str(tmp_path / "ckpt")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    jsonl = tmp_path / "prompts.colossalchat.jsonl"
    first = json.loads(jsonl.read_text().splitlines()[0])
    assert first["messages"]["role"] == "user" and first["gt_answer"]
    assert "'steps': 2" in done.stdout, done.stdout[-2000:]
    metrics = [json.loads(line) for line in
               (tmp_path / "runs" / "ppo_many_roles" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and "value_loss" not in metrics[0], "GRPO: no critic"
    assert all(m["loss"] == m["loss"] for m in metrics), "finite losses"
