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


def run_script(name: str, args, cwd: Path, **env_vars: str) -> str:
    """Runs examples/legacy/<name> in a fresh process and local Ray cluster; returns its combined output."""
    env = dict(os.environ, RAY_NAMESPACE="legacy-e2e", RAY_ADDRESS="local", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0", **env_vars)
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=420)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{output[-6000:]}"
    return output


def assert_user_warned(output: str, script: str, *names: str) -> None:
    for name in names:
        assert f"{script}:" in output and f"FutureWarning: {name} is deprecated" in output, name


def assert_trained(save_dir: Path, trainers: int = 1) -> None:
    """The actor saved before and after training (rank 0 of the trainers' DDP world saves): every tensor finite
    after, and some moved."""
    import torch

    for i in range(trainers):
        start = torch.load(save_dir / f"actor{i}_start.pt", map_location="cpu")
        end = torch.load(save_dir / f"actor{i}_end.pt", map_location="cpu")
        assert start.keys() == end.keys() and start
        assert all(torch.isfinite(v).all() for v in end.values() if v.is_floating_point()), f"actor{i}"
        moved = [k for k in start if not torch.equal(start[k], end[k])]
        assert moved, f"actor{i}: no weight moved"


MANY_ROLES = ["--num_makers", 2, "--num_trainers", 2, "--model", "llama", "--critic_model", "llama",
              "--experience_steps", 3, "--experience_batch_size", 2, "--train_batch_size", 2, "--update_steps", 1,
              "--prompt_tokens", 32, "--max_length", 48]


@pytest.mark.parametrize("keep_half", ["", "1"], ids=["cpu-fp32", "fp16-masters"])
def test_many_roles_half_models_train_to_finite_moved_weights(llama_path, prompts, tmp_path, keep_half):
    """Two makers, two trainers, .half() models, a weight push after every step (mid-run): with the CPU default
    (fp32 kept) and with fp16 kept, where the trainers step fp32 master weights; the second with the makers' old
    sampling loop ($COATI_RELAY_MAKER_SAMPLER=legacy)."""
    save = tmp_path / "ckpt"
    out = run_script("ppo_many_roles.py", [*MANY_ROLES, "--pretrain", llama_path, "--critic_pretrain", llama_path,
                                           "--prompt_path", prompts, "--save_dir", save], tmp_path,
                     COATI_RELAY_KEEP_HALF_ON_CPU=keep_half,
                     COATI_RELAY_MAKER_SAMPLER="legacy" if keep_half else "")
    assert "[trainer performance] samples:" in out and "[maker performance] samples:" in out  # rank 0 prints
    assert "num_gpus=1 of ExperienceMakerHolderImpl(name='maker0') is translated" in out
    assert ("keep fp32 inside this actor" in out) == (not keep_half)
    assert_user_warned(out, "ppo_many_roles.py", "coati.ray.detached_trainer_ppo",
                       "coati.ray.experience_maker_holder.ExperienceMakerHolder",
                       "coati.ray.detached_trainer_ppo.DetachedPPOTrainer")
    assert_trained(save)


def test_many_roles_lora_pushes_adapters(llama_path, prompts, tmp_path):
    """With the default makers (vLLM runs Llama): LoRA pushes reach them."""
    save = tmp_path / "ckpt"
    out = run_script("ppo_many_roles.py", [*MANY_ROLES, "--pretrain", llama_path, "--critic_pretrain", llama_path,
                                           "--prompt_path", prompts, "--lora_rank", 2, "--debug", "--save_dir", save],
                     tmp_path)
    assert "[maker] sampler: vllm" in out, "the makers sample with vLLM"
    assert re.search(r"\[maker\] LoRA push: [1-9]\d* actor weights rebuilt from their adapters", out)
    assert "[trainer] training step" in out
    assert_trained(save)


def test_dummy_throughput_opt_with_initial_sync(opt_path, tmp_path):
    save = tmp_path / "ckpt"
    out = run_script("dummy_throughput.py", ["--num_makers", 2, "--num_trainers", 1, "--model", "opt",
                                             "--pretrain", opt_path, "--experience_steps", 2,
                                             "--experience_batch_size", 2, "--train_batch_size", 2,
                                             "--update_steps", 1, "--train_epochs", 2, "--prompt_tokens", 16,
                                             "--max_length", 32, "--save_dir", save], tmp_path)
    assert "[maker performance] samples:" in out and "[trainer performance] samples:" in out
    assert_user_warned(out, "dummy_throughput.py", "coati.ray.utils")
    assert_trained(save, 1)


def test_custom_trainer_subclass(llama_path, prompts, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    out = run_script("custom_trainer.py", ["--model", "llama", "--pretrain", llama_path, "--critic_pretrain",
                                           llama_path, "--prompt_path", prompts, "--experience_steps", 2,
                                           "--experience_batch_size", 4, "--train_batch_size", 2, "--update_steps", 2,
                                           "--metrics_path", metrics, "--save_dir", tmp_path / "ckpt"], tmp_path)
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(isinstance(s["pg_loss"], float) for s in steps)
    assert "custom trainer: 4 steps" in out
    assert_user_warned(out, "custom_trainer.py", "coati.ray.detached_trainer_base.DetachedTrainer")
    assert_trained(tmp_path / "ckpt")


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
    assert last > first + 0.3, (first, last)
    assert any("DetachedPPOTrainer is deprecated" in w for w in result["warnings"])
