"""ColossalChat's driver (``applications/ColossalChat/rl_example.py``) runs here with only its import changed: this
test calls `launch_distributed` with exactly the keywords that driver passes (the values are ours, small), for GRPO
and DAPO on the think/answer fixture, and checks what the driver's user would look for: checkpoints under
``save_dir``, one evaluation file per task under ``eval_save_dir``, a rollout log under ``rollout_save_dir``, and
trained weights that are finite and differ from the initial ones."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from think_answer_fixture import build_think_answer_model, write_datasets

MAX_PROMPT, MAX_NEW = 96, 24
TAGS = {"think_start": {"text": "<think>", "num_occur": 1}, "think_end": {"text": "</think>", "num_occur": 1},
        "answer_start": {"text": "<answer>", "num_occur": 1}, "answer_end": {"text": "</answer>", "num_occur": 1}}
SYSTEM = "Think inside <think> </think>, then give the answer inside <answer> </answer>."


def grpo_config(algo: str) -> dict:
    """The grpo_config the driver builds for ``-a GRPO`` / ``-a DAPO`` with ``-rt think_answer_tags`` (same keys)."""
    common = {"algo": algo, "lr": 1e-3, "train_microbatch_size": 4, "reward_fn_type": "think_answer_tags",
              "max_length": MAX_PROMPT + MAX_NEW, "max_new_tokens": MAX_NEW, "response_format_tags": TAGS}
    if algo == "GRPO":
        return {**common, "beta": 0.01, "loss_variation": "sample_level"}
    return {**common, "filter_range": [0.01, 0.99], "dynamic_batching": True, "clip_eps_low": 0.2,
            "clip_eps_high": 0.28, "skip_threshold": 20.0, "beta": 0, "loss_variation": "token_level",
            "soft_over_length_punishment": True, "cache_length": MAX_NEW // 4, "filter_truncated_response": True}


def driver_keywords(model: str, data: dict, out: Path, algo: str) -> dict:
    """Every keyword rl_example.py passes to launch_distributed (transformers backend, one producer, one trainer)."""
    import torch

    dataset = {"max_length": MAX_PROMPT, "system_prompt": SYSTEM}
    return dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=2, inference_microbatch_size=1, train_batch_size=2, train_minibatch_size=1,
        train_dataset_config={"path": str(data["train"]), **dataset},
        inference_model_config={"path": model, "checkpoint_path": None, "use_flash_attention_2": True,
                                "torch_dtype": torch.bfloat16},
        generate_config={"top_k": 50, "top_p": 1.0, "temperature": 1.0, "max_length": MAX_PROMPT + MAX_NEW,
                         "do_sample": True, "max_new_tokens": None, "early_stopping": False,
                         "stop_strings": ["</answer>"]},
        num_generations=4,
        train_model_config={"path": model, "use_flash_attention_2": True, "use_cache": False, "checkpoint_path": None},
        grpo_config=grpo_config(algo),
        plugin_config={"tp_size": 1, "pp_size": 1, "microbatch_size": 4, "zero_stage": 0, "max_norm": 1.0},
        inference_backend="transformers", master_addr="localhost", master_port=29516, core_algo=algo,
        project_name=f"cc_{algo}", save_interval=2, save_dir=str(out / "model" / f"cc_{algo}"),
        eval_dataset_config={task: {"path": str(data[task]), **dataset} for task in ("task1", "task2")},
        eval_interval=1, eval_save_dir=str(out / "eval" / f"cc_{algo}"), eval_generation_config={"temperature": 0.6},
        log_rollout_interval=1, rollout_save_dir=str(out / "rollouts"), enable_profiling=False, n_behind=0,
    )


def _weights(files) -> dict:
    """One state dict from safetensors shards or a torch ``model.pt``."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in files:
        out.update(load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, map_location="cpu"))
    return out


def _saved_weight_files(save_dir: Path) -> list:
    """The weight files of the newest checkpoint under ``save_dir`` (safetensors shards or ``model.pt``)."""
    files = sorted(save_dir.rglob("*.safetensors")) + sorted(save_dir.rglob("model.pt"))
    if not files:
        return []
    newest = max({f.parent for f in files}, key=lambda d: (len(str(d)), str(d)))
    return sorted(f for f in files if f.parent == newest)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["GRPO", "DAPO"])
def test_colossalchat_driver_keywords_run(ray_cluster, tmp_path, algo, monkeypatch):
    import torch

    from coati_relay.launch import launch_distributed

    monkeypatch.chdir(tmp_path)  # the driver passes no run_dir: the metrics go to ./runs/PROJECT, as its run's would

    model = str(build_think_answer_model())
    data = write_datasets(tmp_path / "data", num_train=8, num_eval=4)
    kwargs = driver_keywords(model, data, tmp_path, algo)
    launch_distributed(**kwargs)

    saved = _saved_weight_files(Path(kwargs["save_dir"]))
    assert saved, f"no checkpoint under {kwargs['save_dir']}"
    eval_files = sorted(p.name for p in Path(kwargs["eval_save_dir"]).rglob("*.jsonl"))
    for task in ("task1", "task2"):
        assert any(name.startswith(task) for name in eval_files), f"no evaluation file of {task}: {eval_files}"
    first_eval = next(Path(kwargs["eval_save_dir"]).rglob("task1*.jsonl")).read_text().splitlines()
    assert first_eval and json.loads(first_eval[0]), "evaluation records are JSON lines"
    assert any(p.is_file() and p.stat().st_size for p in Path(kwargs["rollout_save_dir"]).rglob("*")), "rollout log"

    trained = _weights(saved)
    initial = _weights(sorted(Path(model).glob("*.safetensors")))
    assert set(initial) <= set(trained), sorted(set(initial) - set(trained))[:5]
    assert all(torch.isfinite(trained[k].float()).all() for k in initial), "trained weights are finite"
    delta = max((trained[k].float() - initial[k].float()).abs().max().item() for k in initial)
    assert delta > 0, "training moved the weights"
