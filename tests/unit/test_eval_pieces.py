"""The pieces of evaluation during training and of the rollout log, each alone: ColossalChat's due test, the
producers' shares, the locked JSONL append, eval-mode grading, the driver's sum over producers, the rollout log."""
from __future__ import annotations

import json
import math
import multiprocessing

import pytest
import torch

from coati_relay.config.schema import RolloutLogSettings
from coati_relay.observe.evaluation import (
    EvalAggregator,
    append_jsonl_locked,
    eval_file,
    eval_metrics,
    is_due,
    shard_indices,
    training_records,
)
from coati_relay.observe.rollout_log import RolloutLog
from coati_relay.rewards.eval_grading import grade_for_eval


def test_due_first_time_then_every_interval_steps():
    steps = [0, 2, 4, 6, 8, 10, 12]
    last, done = -1, []
    for s in steps:
        if is_due(s, last, 5):
            done.append(s)
            last = s
    assert done == [0, 6, 12]  # ColossalChat: step - latest >= interval, first at latest == -1
    assert is_due(7, -1, 100), "the first check always evaluates (a resumed run at step 7 too)"
    assert all(is_due(3, 3, 0) for _ in range(2)), "interval <= 0: every rollout is logged"


def test_shards_are_torch_distributed_sampler_without_shuffle():
    from torch.utils.data import DistributedSampler

    for n, shards in [(5, 2), (7, 3), (4, 4), (2, 3), (6, 1)]:
        for rank in range(shards):
            want = list(DistributedSampler(range(n), num_replicas=shards, rank=rank, shuffle=False,
                                           drop_last=False))
            assert shard_indices(n, shards, rank) == want, (n, shards, rank)
    with pytest.raises(ValueError, match="num_items > 0"):
        shard_indices(0, 1, 0)


def _append(path, k):
    append_jsonl_locked(path, [{"writer": k, "i": i, "pad": "x" * 5000} for i in range(50)])


def test_locked_append_from_processes_never_interleaves(tmp_path):
    path = eval_file(tmp_path / "eval", "math", 12)
    assert path.name == "math_training_step_12.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append, args=(path, k)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 150
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the lock is the file's own: nothing beside it
    for k in range(3):  # each writer's block is contiguous and in order
        mine = [i for i, r in enumerate(records) if r["writer"] == k]
        assert mine == list(range(mine[0], mine[0] + 50))
        assert [records[i]["i"] for i in mine] == list(range(50))


def test_math_rewards_grade_the_answer_whatever_the_format():
    responses = ["so \\boxed{4}", "4", "<think>x</think><answer>4</answer>", "\\boxed{5}"]
    recs = grade_for_eval("boxed", responses, ["4"] * 4, ["p"] * 4, [3, 1, 9, 3])
    assert [r["ans_valid"] for r in recs] == [1.0, 0.0, 0.0, 0.0]
    assert [r["format_valid"] for r in recs] == [1.0, 0.0, 0.0, 1.0]
    assert recs[0] == {"prompt": "p", "prediction": "so \\boxed{4}", "gold": "4", "parsed": "4", "format_valid": 1.0,
                       "ans_valid": 1.0, "response_length": 3, "reward": 10.0}
    # think/answer: in eval mode the answer counts even when the think tags are missing (ColossalChat eval_mode)
    recs = grade_for_eval("think_answer_tags", ["<answer>7</answer>", "<think>a</think><answer>7</answer>"],
                          ["7", "7"], ["p", "q"], [4, 8])
    assert [(r["format_valid"], r["ans_valid"], r["parsed"]) for r in recs] == [(0.0, 1.0, "7"), (1.0, 1.0, "7")]


def test_other_rewards_count_a_positive_reward_as_correct():
    recs = grade_for_eval("toy_letter", ["aaaa", "bbbb"], ["a", "a"], ["p", "p"], [4, 4])
    assert [(r["reward"], r["ans_valid"], r["parsed"], r["format_valid"]) for r in recs] == [
        (1.0, 1.0, None, None), (0.0, 0.0, None, None)]
    calls = []

    def mine(responses, gts, prompts):
        calls.append(list(prompts))
        return [-1.0 if r == "no" else 0.5 for r in responses]

    recs = grade_for_eval(mine, ["no", "yes"], [None, None], ["p1", "p2"], [1, 1])
    assert [r["ans_valid"] for r in recs] == [0.0, 1.0] and calls == [["p1", "p2"]]
    recs = grade_for_eval("ignored by a reward model", ["x", "y"], [None] * 2, ["p"] * 2, [1, 1],
                          rewards=torch.tensor([0.3, -0.2]))
    assert [r["ans_valid"] for r in recs] == [1.0, 0.0]
    with pytest.raises(ValueError, match="2 responses but 1 targets"):
        grade_for_eval("boxed", ["a", "b"], ["1"], ["p", "p"], [1, 1])


def test_aggregator_sums_producers_then_flushes_the_incomplete():
    agg = EvalAggregator(num_producers=2)
    assert agg.add({"producer": 0, "step": 0, "training_step": 0, "counts": {"a": [1, 2], "b": [0, 3]}}) is None
    assert agg.add({"producer": 1, "step": 2, "training_step": 4, "counts": {"a": [2, 2], "b": [3, 3]}}) is None
    step, metrics = agg.add({"producer": 1, "step": 0, "training_step": 0, "counts": {"a": [1, 2], "b": [3, 3]}})
    assert step == 0 and metrics == {"eval/training_step": 0, "eval/a": 0.5, "eval/a/samples": 4,
                                     "eval/b": 0.5, "eval/b/samples": 6}
    (step, metrics), = agg.flush()
    assert step == 2 and metrics["eval/a"] == 1.0 and metrics["eval/training_step"] == 4
    assert agg.flush() == []
    assert math.isnan(eval_metrics(0, {"empty": (0, 0)})["eval/empty"])
    history = [{"step": 1, "loss": 0.1}, {"step": 1, "eval/training_step": 1, "eval/a": 0.5}]
    assert training_records(history) == history[:1]


def test_rollout_log_writes_when_due_and_refuses_an_existing_file(tmp_path):
    path = tmp_path / "rollout" / "proj_run_x.jsonl"
    log = RolloutLog(RolloutLogSettings(path=path, interval=2))
    written = []
    for step in [0, 0, 1, 2, 3, 5]:
        if log.due(step):
            written.append(log.write(step, step, ["p ab"], ["p "], ["ab"], [torch.tensor(0.5).item()]))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == written and [r["train_step"] for r in lines] == [0, 2, 5]
    assert lines[0] == {"train_step": 0, "rollout": ["p ab"], "prompts": ["p "], "responses": ["ab"],
                        "rewards": [0.5], "weight_version": 0}
    with pytest.raises(ValueError, match="already exists"):
        RolloutLog(RolloutLogSettings(path=path, interval=2))


def test_rule_rewards_use_their_tags_and_code_posts_to_the_verifier(monkeypatch):
    import coati_relay.rewards.verifiable as verifiable

    tags = {"answer_start": {"text": "<answer>", "num_occur": 1}, "answer_end": {"text": "</answer>", "num_occur": 1}}
    recs = grade_for_eval("boxed", ["<answer>\\boxed{3}</answer>", "\\boxed{3}"], ["3", "3"], ["p", "p"], [5, 5],
                          tags=tags)
    assert [(r["format_valid"], r["ans_valid"]) for r in recs] == [(1.0, 1.0), (0.0, 1.0)], "eval: any format"
    posted = []

    def verifier(url, cases, program):
        posted.append((url, cases, program))
        return ([1, 1] if "return" in program else [1, 0]), [{}]

    monkeypatch.setattr(verifiable, "post_to_verifier", verifier)
    cases = {"inputs": ["1", "2"], "outputs": ["1", "2"]}
    recs = grade_for_eval("code", ["```python\nreturn x\n```", "x = 1"], [cases, json.dumps(cases)], ["p", "q"],
                          [7, 3], code_verifier_api_url="http://verifier")
    assert [(r["format_valid"], r["ans_valid"], r["reward"]) for r in recs] == [(1.0, 1.0, 10.0), (0.0, 0.0, 0.0)]
    assert set(recs[0]) == {"prompt", "prediction", "test_cases", "test_results", "test_metadata", "parsed",
                            "format_valid", "ans_valid", "response_length", "reward"}
    assert posted[0] == ("http://verifier", cases, "\nreturn x\n") and posted[1][1] == cases
