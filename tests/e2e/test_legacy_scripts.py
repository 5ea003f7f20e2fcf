"""The legacy example scripts (examples/legacy/) run unchanged, each as its own process with its own Ray cluster,
on tiny local models and a prompt CSV; they exit 0, print what the legacy roles print, and warn the user."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coati_relay.toy import build_tiny_model, build_tokenizer, write_toy_dataset

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "legacy"
SMALL_RUN = ["--experience_steps", "2", "--experience_batch_size", "2", "--train_batch_size", "2",
             "--update_steps", "1", "--max_length", "112"]


@pytest.fixture(scope="module")
def llama_path():
    return str(build_tiny_model(arch="llama"))


@pytest.fixture(scope="module")
def opt_path(tmp_path_factory):
    """A tiny OPT config and the toy tokenizer (the dummy benchmark builds random weights of this shape)."""
    from transformers import OPTConfig

    path = tmp_path_factory.mktemp("tiny-opt")
    tokenizer = build_tokenizer()
    OPTConfig(vocab_size=len(tokenizer), hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=2,
              max_position_embeddings=512, word_embed_proj_dim=64, pad_token_id=tokenizer.pad_token_id,
              bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return str(write_toy_dataset(tmp_path_factory.mktemp("data") / "prompts.csv", num_prompts=32, fmt="csv"))


def run_script(name: str, args, cwd: Path) -> str:
    """Runs examples/legacy/<name> in a fresh process and local Ray cluster; returns its combined output."""
    env = dict(os.environ, RAY_NAMESPACE="legacy-e2e", RAY_ADDRESS="local", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0")
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=420)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{output[-6000:]}"
    return output


def assert_user_warned(output: str, script: str, *names: str) -> None:
    for name in names:
        assert f"{script}:" in output and f"FutureWarning: {name} is deprecated" in output, name


def test_mmmt_prompt_two_makers_two_trainers(llama_path, prompts, tmp_path):
    out = run_script("mmmt_prompt.py", ["--num_makers", 2, "--num_trainers", 2, "--model", "llama",
                                        "--critic_model", "llama", "--pretrain", llama_path, "--critic_pretrain",
                                        llama_path, "--prompt_path", prompts, *SMALL_RUN], tmp_path)
    assert "[maker performance] samples:" in out and "[trainer performance] samples:" in out
    assert "num_gpus=1 of ExperienceMakerHolderImpl(name='maker0') is translated" in out
    assert_user_warned(out, "mmmt_prompt.py", "coati.ray.detached_trainer_ppo",
                       "coati.ray.experience_maker_holder.ExperienceMakerHolder",
                       "coati.ray.detached_trainer_ppo.DetachedPPOTrainer")


def test_mmmt_dummy_opt_with_initial_sync(opt_path, tmp_path):
    out = run_script("mmmt_dummy.py", ["--num_makers", 2, "--num_trainers", 1, "--model", "opt", "--critic_model",
                                       "opt", "--pretrain", opt_path, "--critic_pretrain", opt_path,
                                       "--experience_steps", 2, "--experience_batch_size", 2, "--train_batch_size", 2,
                                       "--update_steps", 1, "--train_epochs", 2, "--max_length", 272], tmp_path)
    assert "[maker performance] samples:" in out and "[trainer performance] samples:" in out
    assert_user_warned(out, "mmmt_dummy.py", "coati.ray.utils", "coati.quant")


def test_lora_prompt_pushes_adapters(llama_path, prompts, tmp_path):
    out = run_script("lora_prompt.py", ["--num_trainers", 2, "--model", "llama", "--critic_model", "llama",
                                        "--pretrain", llama_path, "--critic_pretrain", llama_path, "--prompt_path",
                                        prompts, "--lora_rank", 2, "--debug", *SMALL_RUN], tmp_path)
    assert "[trainer performance]" in out
    assert re.search(r"\[maker\] LoRA push: [1-9]\d* actor weights rebuilt from their adapters", out)
    assert "[trainer] training step" in out
    assert "legacy generate ignores the keywords ['experience_batch_size']" in out  # as the legacy maker did
    assert_user_warned(out, "lora_prompt.py", "coati.ray.experience_maker_holder.ExperienceMakerHolder")


def test_custom_trainer_subclass(llama_path, prompts, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    out = run_script("custom_trainer.py", ["--model", "llama", "--pretrain", llama_path, "--critic_pretrain",
                                           llama_path, "--prompt_path", prompts, "--experience_steps", 2,
                                           "--experience_batch_size", 4, "--train_batch_size", 2, "--update_steps", 2,
                                           "--metrics_path", metrics], tmp_path)
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(isinstance(s["pg_loss"], float) for s in steps)
    assert "custom trainer: 4 steps" in out
    assert_user_warned(out, "custom_trainer.py", "coati.ray.detached_trainer_base.DetachedTrainer")


def test_legacy_demo_learns_the_toy_task(ray_cluster, tmp_path):
    from coati_compat.demo_legacy import run_legacy_ppo

    model = str(build_tiny_model())
    csv = str(write_toy_dataset(tmp_path / "prompts.csv", num_prompts=8, fmt="csv"))
    result = run_legacy_ppo(model, csv, str(tmp_path / "run"), steps=100)
    history = result["history"]
    assert [h["step"] for h in history] == list(range(1, 101))
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    first = sum(h["reward"] for h in history[:10]) / 10
    last = sum(h["reward"] for h in history[-10:]) / 10
    assert last > first + 0.05, (first, last)
    assert any("DetachedPPOTrainer is deprecated" in w for w in result["warnings"])
