"""The evaluation and rollout-log keywords in the config build: their defaults (as in ColossalChat), the settings
they make, and a clear error for each bad value, raised before any actor starts."""
from __future__ import annotations

import json

import pytest
from small_run import small_run_kwargs

import coati_relay.config.keys as ck
from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.toy import write_toy_dataset

KEYS = ("eval_dataset_config", "eval_interval", "eval_save_dir", "eval_generation_config", "log_rollout_interval",
        "rollout_save_dir")


@pytest.fixture
def tasks(tmp_path):
    return {"letters": {"path": str(write_toy_dataset(tmp_path / "ev1.jsonl", num_prompts=3)), "max_length": 32},
            "more": {"prompts": [{"messages": {"role": "user", "content": "say b"}, "gt_answer": "b"}] * 2}}


def _errors(tmp_path, model, **over) -> str:
    with pytest.raises(ConfigError) as info:
        build_run_config(**small_run_kwargs(tmp_path, model, **over))
    return str(info.value)


def test_defaults_no_evaluation_and_a_rollout_log_in_the_run_dir(tmp_path, tiny_model_path, caplog):
    ck._WARNED.clear()
    assert not set(KEYS) & set(ck.IGNORED_LAUNCH_KEYS), "they have an effect now"
    with caplog.at_level("WARNING"):
        cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, project_name="my proj"))
    assert not [r for r in caplog.records if "no effect here" in r.getMessage()]
    assert cfg.evaluation is None
    log = cfg.rollout_log
    assert log.interval == 20 and log.path.parent == tmp_path / "run" / "rollout"
    assert log.path.name.startswith("my_proj_run_") and log.path.suffix == ".jsonl"
    assert not log.path.exists(), "producer 0 creates it"
    assert build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, log_rollout_interval=None)).rollout_log \
        is None
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, rollout_save_dir=str(tmp_path / "r"),
                                              log_rollout_interval=0))
    assert cfg.rollout_log.path.parent == tmp_path / "r" and cfg.rollout_log.interval == 0


def test_evaluation_settings(tmp_path, tiny_model_path, tasks):
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, eval_dataset_config=tasks, eval_interval=2,
                                              generate_config={"max_new_tokens": 4, "temperature": 0.7, "top_p": 1.0}))
    ev = cfg.evaluation
    assert sorted(ev.tasks) == ["letters", "more"] and ev.interval == 2 and ev.save_dir == tmp_path / "run" / "eval"
    assert [ev.tasks[t].num_prompts for t in ("letters", "more")] == [3, 2]
    assert ev.num_generations == 1 and ev.sampling == cfg.sampling, "n=1, otherwise generate_config's sampling"
    cfg = build_run_config(**small_run_kwargs(
        tmp_path, tiny_model_path, eval_dataset_config=tasks, eval_save_dir=str(tmp_path / "ev"),
        eval_generation_config={"temperature": 0, "n": 2, "max_new_tokens": 6}))
    ev = cfg.evaluation
    assert (ev.sampling.temperature, ev.sampling.max_new_tokens, ev.num_generations) == (0.0, 6, 2)
    assert ev.interval == 100 and ev.save_dir == tmp_path / "ev"
    assert cfg.sampling.max_new_tokens == 4, "training sampling untouched"
    for off in (0, -1):  # ColossalChat: eval_interval <= 0 turns evaluation off
        assert build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, eval_dataset_config=tasks,
                                                   eval_interval=off)).evaluation is None


def test_training_step_counts_optimizer_steps(tmp_path, tiny_model_path):
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, train_batch_size=2, train_minibatch_size=2))
    assert cfg.optimizer_steps_per_round == 2 and cfg.training_step(3) == 6


def test_bad_evaluation_values_name_the_key_and_the_fix(tmp_path, tiny_model_path, tasks):
    m = tiny_model_path
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"messages": {"role": "user", "content": "x"}, "gt_answer": "a"}\nnot json\n')
    no_gt = tmp_path / "nogt.jsonl"
    no_gt.write_text(json.dumps({"messages": {"role": "user", "content": "x"}}) + "\n")
    (tmp_path / "x.txt").write_text("a prompt\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.jsonl").write_text("{}")
    cases = [
        (dict(eval_dataset_config={"t": {"path": str(tmp_path / "missing.jsonl")}}),
         "eval_dataset_config['t']:", "missing.jsonl"),
        (dict(eval_dataset_config={"t": {"path": str(tmp_path / "x.txt")}}), "eval_dataset_config['t']:",
         "unknown extension"),
        (dict(eval_dataset_config={"t": {"path": str(bad_json)}}), "eval_dataset_config['t']:", "not valid JSON"),
        (dict(eval_dataset_config={"t": {"pth": "x.jsonl"}}), "eval_dataset_config['t'] has no key 'pth'",
         "did you mean 'path'"),
        (dict(eval_dataset_config={"t": "x.jsonl"}), "eval_dataset_config['t'] must be a dataset config", ""),
        (dict(eval_dataset_config={"a/b": tasks["more"]}), "task name 'a/b'", "without '/'"),
        (dict(eval_dataset_config=["x.jsonl"]), "eval_dataset_config must be a non-empty dict", ""),
        (dict(eval_dataset_config={"t": {"path": str(no_gt)}}, grpo_config={"reward_fn_type": "boxed"}),
         "1 of 1 prompts have no 'gt_answer'", "'boxed'"),
        (dict(eval_dataset_config=tasks, eval_save_dir=str(a_file)), "eval_save_dir=", "is a file"),
        (dict(eval_dataset_config=tasks, eval_save_dir=str(full)), "already exists and is not empty", "delete it"),
        (dict(eval_dataset_config=tasks, eval_interval="10"), "eval_interval must be an int", "<= 0"),
        (dict(eval_dataset_config=tasks, eval_generation_config={"temprature": 0.5}),
         "eval_generation_config (over generate_config) has key 'temprature'", "did you mean 'temperature'"),
        (dict(eval_dataset_config=tasks, eval_generation_config={"n": 0}), "eval_generation_config['n']", ">= 1"),
        (dict(eval_dataset_config=tasks, eval_generation_config={"top_p": 2}), "eval_generation_config",
         "top_p"),
        (dict(eval_generation_config=[1]), "eval_generation_config must be a dict", ""),
        (dict(rollout_save_dir=str(a_file)), "rollout_save_dir=", "is a file"),
        (dict(log_rollout_interval=2.5), "log_rollout_interval must be an int", "None (no log)"),
    ]
    for over, first, second in cases:
        message = _errors(tmp_path, m, **over)
        assert first in message and second in message, (over, message)


def test_vllm_evaluation_must_fit_the_engine_sized_for_training(tmp_path, tiny_model_path, tasks):
    long = dict(tasks, more={**tasks["more"], "max_length": 64})
    message = _errors(tmp_path, tiny_model_path, inference_backend="vllm", eval_dataset_config=long,
                      eval_generation_config={"max_new_tokens": 9})
    assert "eval_dataset_config['more']['max_length'] (64) exceeds train_dataset_config's (32)" in message
    assert "max_new_tokens (9) exceeds generate_config's (4)" in message


def test_a_resumed_run_may_add_to_its_evaluation_directory(tmp_path, tiny_model_path, tasks):
    full = tmp_path / "ev"
    full.mkdir()
    (full / "letters_training_step_0.jsonl").write_text("{}\n")
    message = _errors(tmp_path, tiny_model_path, eval_dataset_config=tasks, eval_save_dir=str(full))
    assert "already exists and is not empty" in message
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    checkpoint.mkdir(parents=True)
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, eval_dataset_config=tasks,
                                              eval_save_dir=str(full), resume_from=str(checkpoint)))
    assert cfg.evaluation.save_dir == full
