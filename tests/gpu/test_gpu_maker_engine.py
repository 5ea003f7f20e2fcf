"""The legacy maker's vLLM engine on CUDA, beside the maker's four models in bf16: the engine in the actor's dtype,
sized from the memory free on the device then (`maker_sampler.maker_engine_kwargs`), and it starts and samples."""
from __future__ import annotations

import pytest
import torch
from gpu_lane import MARKS, needs_vllm

pytestmark = MARKS


@pytest.fixture
def four_models(tiny_model_path):
    """Actor, critic-sized, reward-sized and initial model: four bf16 copies of the tiny model on the GPU."""
    from transformers import AutoModelForCausalLM

    models = [AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.bfloat16).cuda().eval()
              for _ in range(4)]
    yield models
    del models
    torch.cuda.empty_cache()


def test_the_engine_takes_the_actors_dtype_and_a_share_of_the_free_memory(four_models):
    from coati_compat.shims.maker_sampler import MAKER_ENGINE_SHARE_OF_FREE, maker_engine_kwargs

    kw = maker_engine_kwargs(four_models[0])
    free, total = torch.cuda.mem_get_info()
    assert kw["dtype"] == "bfloat16"
    assert 0 < kw["gpu_memory_utilization"] * total <= MAKER_ENGINE_SHARE_OF_FREE * free * 1.02, (kw, free, total)


def test_the_engine_starts_and_samples_beside_the_makers_models(four_models):
    needs_vllm()
    from coati_compat.shims.maker_sampler import EngineSampler

    sampler = EngineSampler("vllm")
    try:
        backend = sampler.start(four_models[0])
        assert sampler.kind == "vllm", "the tiny model fits: no fallback"
        assert backend.llm.llm_engine.model_config.dtype == torch.bfloat16
        prompts = torch.tensor([[5, 6, 7], [8, 9, 10]], device="cuda")
        seq = sampler.generate(four_models[0], prompts, max_length=11)[0]
        assert seq.shape == (2, 11) and torch.equal(seq[:, :3], prompts)
    finally:
        if sampler.backend is not None:
            sampler.backend.close()
