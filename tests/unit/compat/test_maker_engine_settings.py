"""The legacy maker's vLLM engine beside its four models (`maker_sampler.maker_engine_kwargs`): on CUDA in the actor's
dtype with a share of the memory free then, and the transformers backend, with one warning, where that share is too
small. The CUDA side is shown on the CPU by giving the decision the free and total memory a GPU would report."""
from __future__ import annotations

import warnings

import pytest
import torch

from coati_compat.shims import maker_sampler
from coati_compat.shims.maker_sampler import EngineSampler, maker_engine_kwargs
from coati_relay.inference.gpu_share import NoRoomForEngine, shared_gpu_engine_kwargs

GB = 10 ** 9
GIB = 2 ** 30


@pytest.fixture
def actor_model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.bfloat16).eval()


def on_a_gpu_with(monkeypatch, free: int, total: int) -> None:
    """The maker's decision sees ``free`` of ``total`` bytes, as `torch.cuda.mem_get_info` on a GPU reports them."""
    monkeypatch.setattr(maker_sampler, "device_memory", lambda device: (free, total))


def test_a_half_actor_gets_a_half_engine_within_the_free_memory(actor_model, monkeypatch):
    on_a_gpu_with(monkeypatch, free=24 * GB, total=80 * GB)
    kw = maker_engine_kwargs(actor_model)
    assert kw["dtype"] == "bfloat16", "the actor's dtype, not float32"
    assert kw["gpu_memory_utilization"] == 0.21, "0.7 of the 24 GB free, as a fraction of the 80 GB device"
    assert kw["gpu_memory_utilization"] * 80 * GB <= 24 * GB, "vLLM refuses a share larger than what is free"
    assert kw["enforce_eager"] is True
    actor_model.float()
    assert maker_engine_kwargs(actor_model)["dtype"] == "float32"


def test_the_engine_on_the_cpu_keeps_its_float32_default(actor_model):
    assert maker_engine_kwargs(actor_model) == {"enforce_eager": True}


def test_a_7b_actor_fits_in_bf16_and_not_in_fp32_beside_its_models():
    """80 GB device, four 7B models in bf16 on it (56 GB): 24 GB free; the engine holds 7B weights, a KV cache for
    one 1024-token sequence (32 layers, 8 KV heads of 128) and 1 GiB of working memory."""
    kv = 2 * 32 * 8 * 128 * 2 * 1024
    kw = shared_gpu_engine_kwargs(torch.bfloat16, 14 * GB, kv, 24 * GB, 80 * GB, share=0.7)
    assert kw == {"dtype": "bfloat16", "gpu_memory_utilization": 0.21}
    with pytest.raises(NoRoomForEngine, match="needs about 27.3 GiB"):
        shared_gpu_engine_kwargs(torch.float32, 28 * GB, 2 * kv, 24 * GB, 80 * GB, share=0.7)
    with pytest.raises(NoRoomForEngine, match="kept for training"):
        shared_gpu_engine_kwargs(torch.bfloat16, 14 * GB, kv, 24 * GB, 80 * GB, reserve_bytes=10 * GB)


def test_without_room_the_maker_samples_with_transformers_after_one_warning(actor_model, monkeypatch):
    on_a_gpu_with(monkeypatch, free=GIB // 2, total=80 * GIB)
    sampler = EngineSampler("vllm")
    with pytest.warns(RuntimeWarning, match="does not fit beside its models.*transformers") as caught:
        backend = sampler.start(actor_model)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert sampler.kind == "transformers" and backend.model is actor_model, "the actor itself samples"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seq = sampler.generate(actor_model, torch.tensor([[5, 6, 7]]), max_length=6, top_k=1)[0]
    assert seq.shape == (1, 6)
