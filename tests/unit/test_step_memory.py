"""What training adds to the device at its first step (`step_state_bytes`), and the colocated vLLM engine sized with
room left for it (`colocated_engine_kwargs`, `training_reserve_bytes`)."""
from __future__ import annotations

import pytest

from coati_relay.inference.vllm_spec import colocated_engine_kwargs
from coati_relay.roles.colocated import training_reserve_bytes
from coati_relay.training.step_memory import step_state_bytes, trainable_parameters

GB = 10 ** 9
GIB = 2 ** 30
N = 1_000_000


@pytest.mark.parametrize("plugin, options, world, per_param", [
    ("ddp", {}, 1, 8 + 4),                                   # fp32 moments, fp32 gradients
    ("ddp", {}, 4, 8 + 4),                                   # DDP replicates everything
    ("ddp", {"gradient_as_bucket_view": True}, 1, 8),        # gradients in the buckets set-up made
    ("hybrid", {}, 1, 8 + 4),                                # zero_stage 0, fp32
    ("hybrid", {"zero_stage": 1, "precision": "bf16"}, 2, 8 / 2 + 2 + 4 / 2),
    ("zero2", {}, 1, 8 + 2 + 4),                             # bf16 gradients, fp32 master gradients
    ("zero2", {}, 2, (8 + 2 + 4) / 2),                       # stage 2: all three partitioned
    ("zero2", {"stage": 1}, 2, 8 / 2 + 2 + 4 / 2),           # stage 1: gradients whole
    ("zero2", {"precision": "fp32"}, 1, 8 + 4),              # no separate master gradients
    ("zero2", {"cpu_offload": True}, 1, 2),                  # moments and master gradients on the CPU
    ("gemini", {}, 1, 8 + 4),                                # gradients in the bf16 chunks
    ("gemini", {"enable_gradient_accumulation": True}, 1, 8 + 2 + 4),
    ("gemini", {"offload_optim_frac": 0.5}, 1, (8 + 4) / 2),
])
def test_the_first_step_adds_moments_and_gradients_per_plugin(plugin, options, world, per_param):
    assert step_state_bytes(N, plugin, options, world) == int(per_param * N)


def test_step_state_bytes_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="unknown plugin"):
        step_state_bytes(N, "fsdp", {})
    with pytest.raises(ValueError, match="world_size"):
        step_state_bytes(N, "ddp", {}, world_size=0)


def test_the_issue_example_leaves_the_engine_room_for_step_one():
    """1.5B parameters under float32 DDP on 80 GB: about 70.6 GB free after set-up. Without the reserve the engine
    took 0.75 of the GPU (60 GB) and the optimizer state and gradients of step 1 (18 GB) did not fit beside it."""
    total, free = 80 * GB, int(70.6 * GB)
    assert colocated_engine_kwargs({}, free, total)["gpu_memory_utilization"] == 0.75, "no reserve: as before"
    reserve = step_state_bytes(int(1.5e9), "ddp", {})
    assert reserve == 18 * GB
    share = colocated_engine_kwargs({}, free, total, reserve)["gpu_memory_utilization"]
    assert share * total + reserve <= free, f"engine {share * total / GB:.1f} GB + step state 18 GB > {free / GB} GB"
    assert share == 0.55


def test_a_reserve_that_leaves_too_little_is_an_error_naming_it():
    with pytest.raises(RuntimeError, match="will take 30.0 GiB"):
        colocated_engine_kwargs({}, free_bytes=32 * GIB, total_bytes=80 * GIB, reserve_bytes=30 * GIB)
    sized = {"gpu_memory_utilization": 0.3}
    assert colocated_engine_kwargs(sized, 32 * GIB, 80 * GIB, 30 * GIB)["gpu_memory_utilization"] == 0.3


def test_the_reserve_counts_each_backends_trainable_parameters(tiny_model_path):
    """The colocated run's reserve: every training backend of the consumer (here a DDP policy on the CPU), its
    trainable parameters only."""
    from coati_relay.training.booster_backend import TrainingBackend, load_causal_lm

    model = load_causal_lm(tiny_model_path)
    model.get_input_embeddings().weight.requires_grad_(False)
    policy = TrainingBackend(model, lr=1e-3, plugin="ddp")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < trainable == trainable_parameters([policy.unwrapped()]) < sum(p.numel() for p in model.parameters())
    assert training_reserve_bytes({"policy": policy}) == 12 * trainable
