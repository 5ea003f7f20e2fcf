"""Bad launch inputs: each gets a clear `ConfigError` from the driver, before any actor starts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from coati_relay.config import ConfigError, build_run_config
from coati_relay.toy import write_toy_dataset


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_path):
    d = tmp_path_factory.mktemp("bad-inputs")
    data = write_toy_dataset(d / "ok.jsonl", num_prompts=16)
    (d / "empty.jsonl").write_text("")
    (d / "broken.jsonl").write_text(json.dumps({"messages": {"role": "user", "content": "hi"}}) + "\n{oops\n")
    (d / "nomessages.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    (d / "noprompt.csv").write_text("question\nhello\n")
    (d / "prompts.txt").write_text("hello\n")
    nopad = d / "nopad-model"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.pad_token = None
    tok.save_pretrained(nopad)
    AutoModelForCausalLM.from_pretrained(tiny_model_path).save_pretrained(nopad)
    return {"dir": d, "data": str(data), "model": tiny_model_path, "nopad": str(nopad)}


def good(files, **over):
    kw = dict(
        num_producers=2, num_proc_per_producer=1, num_consumer_procs=2, num_episodes=1,
        inference_batch_size=4, inference_microbatch_size=2, train_batch_size=2, train_minibatch_size=2,
        train_dataset_config={"path": files["data"], "max_length": 32},
        inference_model_config={"path": files["model"]},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0},
        train_model_config={"path": files["model"]},
        grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter"},
        plugin_config={}, inference_backend="transformers", num_generations=4, core_algo="GRPO",
        run_dir=str(files["dir"] / "run"),
    )
    kw.update(over)
    return kw


def test_good_config_passes_and_derives_sizes(files):
    cfg = build_run_config(**good(files))
    assert cfg.data.num_prompts == 16
    assert cfg.prompts_per_round == 8 and cfg.tasks_per_round == 4 and cfg.entries_per_consumer == 2
    assert cfg.rounds_per_episode == 2 and cfg.optimizer_steps_per_round == 2
    assert cfg.plugin.name == "ddp"


def _p(files, key):
    return str(files["dir"] / key)


# (case id, overrides (callable of files), words the message must contain)
BAD = [
    ("producers-str", lambda f: {"num_producers": "2"}, ["num_producers", "int"]),
    ("producers-zero", lambda f: {"num_producers": 0}, ["num_producers", "> 0"]),
    ("consumers-negative", lambda f: {"num_consumer_procs": -1}, ["num_consumer_procs"]),
    ("episodes-float", lambda f: {"num_episodes": 1.5}, ["num_episodes"]),
    ("bool-size", lambda f: {"train_batch_size": True}, ["train_batch_size"]),
    ("micro-not-dividing", lambda f: {"inference_microbatch_size": 3}, ["inference_microbatch_size"]),
    ("deadlock-sizes", lambda f: {"train_batch_size": 3, "train_minibatch_size": 3},
     ["train_batch_size * num_consumer_procs", "never come"]),
    ("minibatch-gt-batch", lambda f: {"train_minibatch_size": 4}, ["train_minibatch_size"]),
    ("consumers-vs-microbatches", lambda f: {"num_consumer_procs": 4, "inference_batch_size": 2,
                                             "inference_microbatch_size": 2, "train_batch_size": 1,
                                             "train_minibatch_size": 1}, ["split evenly", "num_consumer_procs=4"]),
    ("missing-model-path", lambda f: {"inference_model_config": {}}, ["inference_model_config['path']"]),
    ("model-path-not-dir", lambda f: {"inference_model_config": {"path": "/nonexistent/model"}},
     ["not a local model directory"]),
    ("tokenizer-no-pad", lambda f: {"inference_model_config": {"path": f["nopad"]},
                                    "train_model_config": {"path": f["nopad"]}}, ["pad token"]),
    ("dataset-missing", lambda f: {"train_dataset_config": {"path": _p(f, "nope.jsonl")}}, ["nope.jsonl"]),
    ("dataset-empty", lambda f: {"train_dataset_config": {"path": _p(f, "empty.jsonl")}}, ["empty.jsonl"]),
    ("dataset-malformed", lambda f: {"train_dataset_config": {"path": _p(f, "broken.jsonl")}}, ["broken.jsonl"]),
    ("dataset-no-messages", lambda f: {"train_dataset_config": {"path": _p(f, "nomessages.jsonl")}},
     ["messages"]),
    ("csv-no-prompt-column", lambda f: {"train_dataset_config": {"path": _p(f, "noprompt.csv")}}, ["prompt"]),
    ("dataset-unknown-extension", lambda f: {"train_dataset_config": {"path": _p(f, "prompts.txt")}},
     ["prompts.txt"]),
    ("dataset-config-missing", lambda f: {"train_dataset_config": {}}, ["train_dataset_config"]),
    ("dataset-too-small", lambda f: {"inference_batch_size": 16, "inference_microbatch_size": 16,
                                     "train_batch_size": 16, "train_minibatch_size": 16},
     ["fewer than one weight version"]),
    ("unknown-algo", lambda f: {"core_algo": "TRPO"}, ["core_algo", "GRPO"]),
    ("algo-disagrees", lambda f: {"grpo_config": {"algo": "DAPO"}}, ["disagrees"]),
    ("grpo-one-generation", lambda f: {"num_generations": 1}, ["num_generations must be >= 2", "PPO"]),
    ("unknown-backend", lambda f: {"inference_backend": "sglang"}, ["inference_backend", "vllm"]),
    ("unknown-plugin", lambda f: {"plugin_config": {"plugin": "fsdp"}}, ["plugin", "ddp"]),
    ("cuda-plugin-on-cpu", lambda f: {"plugin_config": {"plugin": "gemini"}}, ["gemini"]),
    ("zero-stage-on-cpu", lambda f: {"plugin_config": {"zero_stage": 2}}, ["plugin_config"]),
    ("negative-lr", lambda f: {"grpo_config": {"lr": -1.0}}, ["lr", "> 0"]),
    ("unknown-grpo-key", lambda f: {"grpo_config": {"learning_rate": 1e-3}}, ["learning_rate"]),
    ("misspelt-grpo-key", lambda f: {"grpo_config": {"clip_eps_hgh": 0.3}}, ["did you mean 'clip_eps_high'"]),
    ("misspelt-launch-keyword", lambda f: {"num_generation": 4}, ["no keyword 'num_generation'",
                                                                  "did you mean 'num_generations'"]),
    ("unknown-launch-keyword", lambda f: {"wandb_project": "x"}, ["no keyword 'wandb_project'"]),
    ("misspelt-dataset-key", lambda f: {"train_dataset_config": {"path": f["data"], "max_lenght": 32}},
     ["train_dataset_config has no key 'max_lenght'", "did you mean 'max_length'"]),
    ("unknown-train-model-key", lambda f: {"train_model_config": {"path": f["model"], "dtype": "bf16"}},
     ["train_model_config has no key 'dtype'"]),
    ("bad-gamma", lambda f: {"core_algo": "PPO", "num_generations": 1, "train_batch_size": 2,
                             "train_minibatch_size": 2, "grpo_config": {"gamma": 1.5}}, ["gamma", "[0, 1]"]),
    ("unknown-reward", lambda f: {"grpo_config": {"reward_fn_type": "vibes"}}, ["vibes"]),
    ("bad-loss-variation", lambda f: {"grpo_config": {"loss_variation": "seq"}}, ["loss_variation"]),
    ("bad-temperature", lambda f: {"generate_config": {"temperature": 0}}, ["temperature"]),
    ("bad-top-p", lambda f: {"generate_config": {"top_p": 1.5}}, ["top_p"]),
    ("unknown-generate-key", lambda f: {"generate_config": {"max_newtokens": 8}}, ["max_newtokens"]),
    ("negative-n-behind", lambda f: {"n_behind": -1}, ["n_behind"]),
    ("bad-failure-policy", lambda f: {"on_producer_failure": "ignore"}, ["on_producer_failure"]),
    ("config-not-dict", lambda f: {"grpo_config": ["lr", 1]}, ["grpo_config must be a dict"]),
    ("critic-without-ppo", lambda f: {"critic_model_config": {"path": f["model"]}}, ["critic_model_config"]),
    ("unknown-weight-sync", lambda f: {"weight_sync": "nccl"}, ["weight_sync", "collective"]),
    ("collective-sync-cannot-continue", lambda f: {"weight_sync": "collective", "on_producer_failure": "continue"},
     ["every broadcast"]),
    ("tensor-parallel-producer-on-cpu", lambda f: {"num_proc_per_producer": 2}, ["num_proc_per_producer"]),
    ("unknown-placement-strategy", lambda f: {"placement_strategy": "pack"}, ["placement_strategy", "PACK"]),
    ("bad-placement-timeout", lambda f: {"placement_timeout_s": 0}, ["placement_timeout_s"]),
    ("unknown-role", lambda f: {"role_resources": {"producers": {"x": 1}}}, ["did you mean 'producer'"]),
    ("role-resource-cpu", lambda f: {"role_resources": {"consumer": {"CPU": 2}}}, ["not CPU/GPU"]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,overrides,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_clear_error(files, case, overrides, words):
    with pytest.raises(ConfigError) as err:
        build_run_config(**good(files, **overrides(files)))
    message = str(err.value)
    for w in words:
        assert w in message, f"{case}: {w!r} not in {message!r}"


def test_all_errors_reported_together(files):
    with pytest.raises(ConfigError) as err:
        build_run_config(**good(files, num_producers=0, core_algo="TRPO", inference_backend="x"))
    assert str(err.value).count("\n  - ") >= 3


def test_validation_starts_no_actor(files):
    import ray

    was = ray.is_initialized()
    with pytest.raises(ConfigError):
        build_run_config(**good(files, num_producers=0))
    assert ray.is_initialized() == was


def test_ppo_allows_one_generation_and_gets_a_critic(files):
    cfg = build_run_config(**good(files, core_algo="PPO", num_generations=1,
                                  train_batch_size=2, train_minibatch_size=2))
    assert cfg.models.critic_model_path == str(Path(files["model"]))
    assert cfg.algo.kl_coef > 0


def test_producer_processes_reach_vllm_as_tensor_parallel_size(files, monkeypatch):
    """num_proc_per_producer reserves that many GPUs per producer and shards its vLLM engine over them; anything
    that cannot honour it is refused (checked as a CUDA host would see it)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = build_run_config(**good(files, num_proc_per_producer=2, inference_backend="vllm"))
    assert cfg.models.inference_model_kwargs["tensor_parallel_size"] == 2
    assert "tensor_parallel_size" not in build_run_config(**good(files)).models.inference_model_kwargs
    with pytest.raises(ConfigError, match="only inference_backend='vllm'"):
        build_run_config(**good(files, num_proc_per_producer=2, inference_backend="transformers"))
    with pytest.raises(ConfigError, match="tensor_parallel_size=4 disagrees"):
        build_run_config(**good(files, num_proc_per_producer=2, inference_backend="vllm",
                                inference_model_config={"path": files["model"], "tensor_parallel_size": 4}))


def test_colossalchat_keys_without_effect_warn_once(files, caplog):
    import coati_relay.config_keys as ck

    ck._WARNED.clear()
    over = dict(grpo_config={"lr": 1e-3, "dynamic_batching": True, "skip_threshold": 20.0},
                eval_interval=10, master_port=29506,
                generate_config={"max_new_tokens": 8, "do_sample": True},
                train_model_config={"path": files["model"], "use_flash_attention_2": True})
    with caplog.at_level("WARNING", logger="coati_relay.config_keys"):
        build_run_config(**good(files, **over))
        build_run_config(**good(files, **over))
    lines = [r.getMessage() for r in caplog.records]
    for key in ("grpo_config['dynamic_batching']", "grpo_config['skip_threshold']",
                "launch_distributed['eval_interval']", "launch_distributed['master_port']",
                "generate_config['do_sample']", "train_model_config['use_flash_attention_2']"):
        assert sum(key in line and "no effect here" in line for line in lines) == 1, (key, lines)


def test_algorithm_defaults_come_from_the_estimator_spec(files):
    dapo = build_run_config(**good(files, core_algo="DAPO")).algo
    assert (dapo.beta, dapo.loss_variation, dapo.clip_eps_high, dapo.filter_truncated_response) == (
        0.0, "token_level", 0.28, True)
    grpo = build_run_config(**good(files)).algo
    assert (grpo.beta, grpo.loss_variation, grpo.clip_eps_high, grpo.critic_lr) == (0.01, "sample_level", 0.2, 1e-3)


def test_version_a_task_needs(files):
    cfg = build_run_config(**good(files))  # 2 producers x 4 prompts in micro-batches of 2: 4 tasks per round
    assert cfg.tasks_per_round == 4
    assert [cfg.version_needed(t) for t in (0, 3, 4, 9)] == [0, 0, 1, 2]
    stale = build_run_config(**good(files, n_behind=1))
    assert [stale.version_needed(t) for t in (0, 4, 9)] == [-1, 0, 1]


def test_actor_errors_are_told_by_their_own_exception_and_notes():
    from coati_relay.launch import _short

    cause = KeyError("no such answer")
    cause.add_note("raised by reward function 'r' on a batch of 4 responses")

    class Wrapped(RuntimeError):  # as Ray's RayTaskError: its text is the remote traceback, .cause the exception
        def __init__(self):
            super().__init__("Traceback (most recent call last): ..." + "x" * 2000)
            self.cause = cause

    assert _short(Wrapped()) == ("KeyError: 'no such answer' (raised by reward function 'r' on a batch of 4 "
                                 "responses)")
    assert _short(ValueError("v" * 700), limit=20) == "ValueError: vvvvvvvv ..."
