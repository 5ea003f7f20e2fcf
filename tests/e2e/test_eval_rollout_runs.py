"""Evaluation during training and the rollout log in whole short runs (transformers backend, 1 producer, 1 consumer,
an evaluation set of two tasks): ColossalChat's files per step, the accuracies in metrics.jsonl and in on_evaluate,
producer 0's rollout log with prompts, responses and rewards, and trained weights that are finite and moved."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_helpers import run_kwargs

from coati_relay import launch_distributed
from coati_relay.rewards import letter_fraction
from coati_relay.toy import write_toy_dataset

pytestmark = pytest.mark.slow
RECORD_KEYS = {"prompt", "prediction", "gold", "parsed", "format_valid", "ans_valid", "response_length", "reward"}


class Evaluations:
    def __init__(self):
        self.calls = []

    def on_evaluate(self, step, results):
        self.calls.append((step, dict(results)))


def _jsonl(path: Path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("placement", ["disaggregated", "colocated"])
def test_evaluation_files_metrics_rollout_log_and_weights(request, placement, tiny_model_path, data, tmp_path):
    from transformers import AutoModelForCausalLM

    if placement == "disaggregated":
        request.getfixturevalue("ray_cluster")
    tasks = {"letters": {"path": str(write_toy_dataset(tmp_path / "eval_a.jsonl", num_prompts=3, seed=5)),
                         "max_length": 32},
             "bees": {"prompts": [{"messages": {"role": "user", "content": f"write b {i}"}, "gt_answer": "b"}
                                  for i in range(2)], "max_length": 32}}
    hook = Evaluations()
    run_dir, eval_dir = tmp_path / "run", tmp_path / "eval"
    result = launch_distributed(**run_kwargs(
        tiny_model_path, data, run_dir, backend="transformers", rounds=3, num_producers=1, num_consumer_procs=1,
        inference_batch_size=8, train_batch_size=8, colocate=placement == "colocated", callbacks=[hook],
        project_name="eval e2e", eval_dataset_config=tasks, eval_interval=1, eval_save_dir=str(eval_dir),
        eval_generation_config={"temperature": 0.7, "max_new_tokens": 6}, log_rollout_interval=1))
    assert [h["step"] for h in result.history] == [1, 2, 3]

    # ColossalChat's files: one per task per step, one record per prompt (n=1), answers judged by the reward
    # producers see weights 0, 1 and 2 (the last version is never generated with); one optimizer step a round
    names = sorted(p.name for p in eval_dir.iterdir() if p.suffix == ".jsonl")
    assert names == sorted(f"{t}_training_step_{s}.jsonl" for t in tasks for s in (0, 1, 2))
    accuracy = {}
    for task, gold, size in (("letters", "a", 3), ("bees", "b", 2)):
        for step in (0, 1, 2):
            records = _jsonl(eval_dir / f"{task}_training_step_{step}.jsonl")
            assert len(records) == size and all(set(r) == RECORD_KEYS for r in records)
            for r in records:
                assert r["gold"] == gold and r["prompt"] and r["parsed"] is None
                assert 1 <= r["response_length"] <= 6, "eval_generation_config's max_new_tokens"
                assert r["reward"] == pytest.approx(letter_fraction(r["prediction"], gold), abs=1e-6)
                assert r["ans_valid"] == float(r["reward"] > 0)
            accuracy[task, step] = sum(r["ans_valid"] for r in records) / size

    # metrics.jsonl and the hook carry the same records
    lines = _jsonl(run_dir / "metrics.jsonl")
    evals = [line for line in lines if "eval/training_step" in line]
    assert [e["step"] for e in evals] == [0, 1, 2] and [e["eval/training_step"] for e in evals] == [0, 1, 2]
    for e in evals:
        for task, size in (("letters", 3), ("bees", 2)):
            assert e[f"eval/{task}"] == pytest.approx(accuracy[task, e["step"]])
            assert e[f"eval/{task}/samples"] == size
    assert hook.calls == [(e["step"], e) for e in evals]
    assert result.summary["steps"] == 3, "the summary counts training rounds only"

    # producer 0's rollout log: the first rollout of each step, first response per prompt and its reward
    (log_file,) = (run_dir / "rollout").iterdir()
    assert log_file.name.startswith("eval_e2e_run_") and log_file.suffix == ".jsonl"
    logged = _jsonl(log_file)
    assert [r["train_step"] for r in logged] == [0, 1, 2] == [r["weight_version"] for r in logged]
    for r in logged:
        assert len(r["prompts"]) == len(r["responses"]) == len(r["rewards"]) == len(r["rollout"]) == 4
        assert all("a" in p for p in r["prompts"])
        for prompt, response, reward, together in zip(r["prompts"], r["responses"], r["rewards"], r["rollout"]):
            assert reward == pytest.approx(letter_fraction(response, "a"), abs=1e-6)
            assert together.startswith(prompt.strip()[:8])

    # the trained weights: finite, and not the initial ones
    saved = torch.load(Path(result.checkpoints[-1]) / "policy" / "model.pt", map_location="cpu")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    assert all(torch.isfinite(v).all() for v in saved.values())
    assert any(not torch.equal(base[k], v.float()) for k, v in saved.items() if k in base), "training moved them"
