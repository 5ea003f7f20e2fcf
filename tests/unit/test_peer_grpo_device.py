"""The TRL side of the peer benchmark (`benchmarks/peer_grpo.py`) trains on the GPU where there is one, in TRL's
default precision, and on the CPU elsewhere. Shown on the CPU by stopping the side where it builds TRL's config."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def peer_grpo():
    pytest.importorskip("trl")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("peer_grpo", BENCHMARKS / "peer_grpo.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


class ConfigBuilt(Exception):
    """Stops the TRL side once its config's keywords are known."""


def trl_config_keywords(peer_grpo, monkeypatch, tmp_path, tiny_model_path, cuda: bool, **run):
    import trl
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401  imported (bitsandbytes' CUDA probe) before CUDA is faked

    seen = {}

    def record(**kwargs):
        seen.update(kwargs)
        raise ConfigBuilt

    monkeypatch.setattr(trl, "GRPOConfig", record)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    with pytest.raises(ConfigBuilt):
        peer_grpo.run_trl(tiny_model_path, 2, tmp_path, 4, **run)
    return seen


@pytest.mark.parametrize("cuda", [True, False])
def test_trl_trains_on_the_gpu_where_there_is_one(peer_grpo, monkeypatch, tmp_path, tiny_model_path, cuda):
    seen = trl_config_keywords(peer_grpo, monkeypatch, tmp_path, tiny_model_path, cuda)
    assert seen["use_cpu"] is (not cuda), seen
    assert not {"bf16", "fp16"} & set(seen), "TRL's own default precision (bf16 mixed precision on a GPU)"
    seen = trl_config_keywords(peer_grpo, monkeypatch, tmp_path, tiny_model_path, cuda, precision="fp32")
    assert seen["bf16"] is False and "fp16" not in seen


def test_trl_default_precision_stands_on_the_cpu(peer_grpo, tmp_path):
    from trl import GRPOConfig

    config = GRPOConfig(output_dir=str(tmp_path), report_to="none", **peer_grpo.trl_device_kwargs(cuda=False))
    assert config.use_cpu is True and config.bf16 is True, "TRL's default, as the CPU benchmark has always run it"


def test_the_moved_and_finite_check_reads_a_model_in_any_dtype(peer_grpo, tiny_model_path):
    """The trained model is compared on the CPU in float32 (a model on the GPU, in bf16, compares the same way)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)
    got = peer_grpo._moved_and_finite(tiny_model_path, model.to(torch.bfloat16))
    assert got["checked"] and got["finite"] and got["moved"] >= 1, got
