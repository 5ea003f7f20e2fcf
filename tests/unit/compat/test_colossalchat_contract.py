"""Every migrated call, for both targets, bound to ColossalChat's ``launch_distributed`` signature and config keys.

ColossalChat's side is DATA below, read from ColossalAI commit 4f9953be3 (applications/ColossalChat/coati/
distributed/launch.py, producer.py, consumer.py, grpo_consumer.py, inference_backend.py, reward/reward_fn.py,
coati/dataset/loader.py, and colossalai/booster/plugin/hybrid_parallel_plugin.py), not imported: ColossalChat's
``coati`` is not installed here. A stub built from it takes the migrated keywords with ``inspect.Signature.bind``.

- ``--target colossalchat``: only ColossalChat's keywords, every config key one its code reads (or hands to the
  constructor it names), the keys it indexes without a default present, and the size asserts of its launch,
  producer and consumer hold.
- the default target (this engine): ColossalChat's keywords plus the engine's extensions, which are listed here
  (``ENGINE_EXTENSIONS``); its PPO-only config keys are listed the same way.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from coati_compat.migrate import migrate_file

COMMIT = "4f9953be3"
REQUIRED = inspect.Parameter.empty

# launch.py: launch_distributed's parameters in order, with their defaults.
LAUNCH_PARAMETERS = (
    ("num_producers", REQUIRED), ("num_proc_per_producer", REQUIRED), ("num_consumer_procs", REQUIRED),
    ("num_episodes", REQUIRED), ("inference_batch_size", REQUIRED), ("inference_microbatch_size", REQUIRED),
    ("train_batch_size", REQUIRED), ("train_minibatch_size", REQUIRED), ("train_dataset_config", REQUIRED),
    ("inference_model_config", REQUIRED), ("generate_config", REQUIRED), ("train_model_config", REQUIRED),
    ("grpo_config", REQUIRED), ("plugin_config", REQUIRED), ("tokenizer_config", None),
    ("inference_backend", "transformers"), ("num_generations", 8), ("master_addr", "localhost"),
    ("master_port", 29500), ("core_algo", "GRPO"), ("project_name", None), ("save_interval", 100),
    ("save_dir", "./model"), ("eval_dataset_config", None), ("eval_interval", 100), ("eval_save_dir", None),
    ("eval_generation_config", None), ("log_rollout_interval", 20), ("rollout_save_dir", "./rollout"),
    ("enable_profiling", False), ("n_behind", 0),
)
# launch.py ALGO_MAP; "Simple" trains with a plain LM loss (SimpleConsumer), not RL.
CORE_ALGOS = ("GRPO", "DAPO", "REINFORCE_PPB", "RLOO")

# Config keys ColossalChat's code reads, per section: key -> where (file:function). REQUIRED_KEYS: indexed without a
# default (a KeyError or TypeError there without them).
GENERATE_READ = {"temperature": "launch.py:launch_distributed (run_name), producer.py:BaseProducer.loop, "
                                "grpo_consumer.py:GRPOConsumer.step (logits / temperature)",
                 "top_p": "launch.py:launch_distributed (run_name)",
                 "max_tokens": "grpo_consumer.py:GRPOConsumer.__init__ (filter_truncated_response)",
                 "max_new_tokens": "grpo_consumer.py:GRPOConsumer.__init__ (filter_truncated_response)"}
GENERATE_REQUIRED = ("temperature", "top_p")
# inference_backend.py hands generate_config whole to the backend: vllm.SamplingParams(**config) (vLLM 0.7.3, the
# version ColossalChat's README installs) or transformers' model.generate(**config).
VLLM_SAMPLING_KEYS = ("n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature",
                      "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "bad_words", "ignore_eos",
                      "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "detokenize", "skip_special_tokens",
                      "spaces_between_special_tokens", "logits_processors", "include_stop_str_in_output",
                      "truncate_prompt_tokens", "output_kind", "guided_decoding", "logit_bias", "allowed_token_ids")
TRANSFORMERS_GENERATE_KEYS = ("max_length", "max_new_tokens", "min_length", "min_new_tokens", "early_stopping",
                              "do_sample", "num_beams", "temperature", "top_k", "top_p", "min_p",
                              "repetition_penalty", "stop_strings", "use_cache", "eos_token_id", "pad_token_id")
GENERATE_KEYS = {"vllm": VLLM_SAMPLING_KEYS, "transformers": TRANSFORMERS_GENERATE_KEYS}

GRPO_READ = {
    "algo": "grpo_consumer.py:GRPOConsumer.__init__ (self.adv: the advantage estimator; None computes none)",
    "lr": "grpo_consumer.py:GRPOConsumer.__init__ (HybridAdam, CosineAnnealingWarmupLR eta_min)",
    "weight_decay": "grpo_consumer.py:GRPOConsumer.__init__",
    "beta": "grpo_consumer.py:GRPOConsumer.__init__ (PolicyLoss; a reference model when > 0)",
    "clip_eps_low": "grpo_consumer.py:GRPOConsumer.__init__ (PolicyLoss)",
    "clip_eps_high": "grpo_consumer.py:GRPOConsumer.__init__ (PolicyLoss)",
    "loss_variation": "grpo_consumer.py:GRPOConsumer.__init__ (PolicyLoss)",
    "filter_range": "grpo_consumer.py:GRPOConsumer.__init__",
    "filter_truncated_response": "grpo_consumer.py:GRPOConsumer.__init__",
    "dynamic_batching": "consumer.py:BaseConsumer.loop, grpo_consumer.py:GRPOConsumer.step",
    "train_microbatch_size": "grpo_consumer.py:GRPOConsumer.step (and the pp microbatch_size)",
    "reward_fn_type": "producer.py:BaseProducer.__init__ (the evaluation function), BaseProducer.loop",
    "response_format_tags": "producer.py:BaseProducer.__init__ (VerifiableReward tags)",
    "max_new_tokens": "producer.py:BaseProducer.__init__ -> reward_fn.py:math_reward_fn kwargs['max_new_tokens']",
    "soft_over_length_punishment": "producer.py:BaseProducer.__init__ -> reward_fn.py",
    "cache_length": "producer.py:BaseProducer.__init__ -> reward_fn.py (with soft_over_length_punishment)",
    "code_verifier_api_url": "producer.py:BaseProducer.__init__ -> reward_fn.py:code_reward_fn",
}
GRPO_REQUIRED = ("algo", "reward_fn_type", "max_new_tokens")
GRPO_VALUES = {"algo": CORE_ALGOS, "reward_fn_type": ("think_answer_tags", "boxed", "code"),
               "loss_variation": ("sample_level", "token_level")}

# consumer.py:BaseConsumer.setup: HybridParallelPlugin(**{tp_size 1, pp_size 1, precision bf16, zero_stage 2,
# **plugin_config}); its constructor's keywords (launch.py also reads ep_size, which this plugin rejects).
HYBRID_PARALLEL_KEYS = (
    "tp_size", "pp_size", "sp_size", "precision", "zero_stage", "enable_all_optimization", "enable_fused_normalization",
    "enable_flash_attention", "enable_jit_fused", "enable_sequence_parallelism", "sequence_parallelism_mode",
    "parallel_output", "num_microbatches", "microbatch_size", "initial_scale", "min_scale", "growth_factor",
    "backoff_factor", "growth_interval", "hysteresis", "max_scale", "max_norm", "broadcast_buffers",
    "ddp_bucket_cap_mb", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view", "static_graph",
    "zero_bucket_size_in_m", "cpu_offload", "communication_dtype", "overlap_communication", "custom_policy",
    "pp_style", "num_model_chunks", "scheduler_nodes", "num_layers_per_stage", "gradient_checkpoint_config",
    "enable_metadata_cache", "make_vocab_size_divisible_by", "dp_outside", "overlap_p2p", "overlap_allgather",
    "fp8_communication", "use_fp8", "inner_ring_size")

# producer.py pops "path" and gives the rest to loader.py:RawConversationDataset(tokenizer, path, max_length,
# system_prompt): both without defaults. launch.py counts the lines of "path" as JSONL.
DATASET_KEYS = ("path", "max_length", "system_prompt")
# producer.py / consumer.py pop "path" and "checkpoint_path"; the rest goes to from_pretrained or vllm.LLM.
MODEL_KEYS = ("path", "checkpoint_path")

# What only this engine has: allowed in the default target's calls, listed so that a new one is a decision.
ENGINE_EXTENSIONS = {"critic_model_config": "PPO's critic", "reward_model_config": "a reward model",
                     "run_dir": "metrics and checkpoints", "report_to": "trackers besides metrics.jsonl",
                     "seed": "a legacy --seed", "timeout_s": "a legacy --timeout_s"}
ENGINE_SECTION_EXTENSIONS = {
    "grpo_config": ("critic_lr", "kl_coef", "value_clip", "ppo_epochs", "lr_scheduler", "policy_loss", "value_loss"),
    "generate_config": ("max_new_tokens",),  # vLLM's max_tokens under transformers' name
    "train_model_config": ("lora",),
    "plugin_config": ("plugin", "allow_cpu_fallback", "stage", "shard_param_frac", "offload_optim_frac",
                      "offload_param_frac", "pin_memory", "initial_scale", "precision", "cpu_offload"),
}

ROOT = Path(__file__).resolve().parents[3]
LEGACY = sorted((ROOT / "examples" / "legacy").glob("*.py"))
# Values for the flags each example requires (read, never opened: launch_kwargs only computes keywords; with the
# run length given, a four-role script's --steps is not turned into passes over the prompt file).
FLAGS = {"prompt_path": "prompts.csv", "prompt_csv": "prompts.csv", "pretrain": "/models/actor",
         "critic_pretrain": "/models/critic", "num_episodes": 1}


def colossalchat_stub() -> inspect.Signature:
    """ColossalChat's launch_distributed signature, built from `LAUNCH_PARAMETERS`."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(name, kind, default=default) for name, default in LAUNCH_PARAMETERS])


def engine_stub() -> inspect.Signature:
    """ColossalChat's signature plus the engine's listed extensions (keyword-only, optional)."""
    extra = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in ENGINE_EXTENSIONS]
    return colossalchat_stub().replace(parameters=list(colossalchat_stub().parameters.values()) + extra)


def _kwargs(legacy: Path, target: str, **flags):
    m = migrate_file(legacy, target=target)
    wanted = {k: v for k, v in FLAGS.items() if f'"--{k}"' in m.script}
    return m.launch_kwargs({**wanted, **flags})


def _unknown(given, *known):
    return sorted(set(given) - set().union(*map(set, known)))


def _check_sizes(kw, dp_size):
    """The asserts of launch.py, producer.py (BaseProducer.__init__) and consumer.py (BaseConsumer.__init__)."""
    assert (kw["inference_batch_size"] * kw["num_producers"]) % (kw["train_batch_size"] * dp_size) == 0
    assert kw["inference_batch_size"] % kw["inference_microbatch_size"] == 0
    assert kw["train_batch_size"] % kw["train_minibatch_size"] == 0


def test_stub_is_colossalchats_signature():
    sig = colossalchat_stub()
    assert list(sig.parameters)[:3] == ["num_producers", "num_proc_per_producer", "num_consumer_procs"]
    assert len(sig.parameters) == 31 and sig.parameters["core_algo"].default == "GRPO"
    with pytest.raises(TypeError, match="critic_model_config"):
        sig.bind(**{name: 1 for name, d in LAUNCH_PARAMETERS if d is REQUIRED}, critic_model_config={})
    with pytest.raises(TypeError, match="missing"):
        sig.bind(num_producers=1)


@pytest.mark.parametrize("backend", ["vllm", "transformers"])
@pytest.mark.parametrize("algo", CORE_ALGOS)
@pytest.mark.parametrize("legacy", LEGACY, ids=[p.stem for p in LEGACY])
def test_colossalchat_target_binds_with_known_keys(legacy, algo, backend):
    kw = _kwargs(legacy, "colossalchat", algo=algo, inference_backend=backend)
    colossalchat_stub().bind(**kw)  # only ColossalChat's keywords, every required one
    assert kw["core_algo"] == kw["grpo_config"]["algo"] == algo
    assert kw["inference_backend"] == backend and kw["num_generations"] >= 2

    gen = kw["generate_config"]
    assert not _unknown(gen, GENERATE_KEYS[backend]) and all(k in gen for k in GENERATE_REQUIRED)
    grpo = kw["grpo_config"]
    assert not _unknown(grpo, GRPO_READ) and all(k in grpo for k in GRPO_REQUIRED)
    for key, values in GRPO_VALUES.items():
        assert grpo.get(key, values[0]) in values, key
    if grpo.get("soft_over_length_punishment"):
        assert grpo["cache_length"] >= 1
    assert grpo["max_new_tokens"] == gen.get("max_tokens", gen.get("max_new_tokens"))

    plugin = kw["plugin_config"]
    assert not _unknown(plugin, HYBRID_PARALLEL_KEYS)
    dataset = kw["train_dataset_config"]
    assert sorted(dataset) == sorted(DATASET_KEYS) and dataset["path"].endswith(".jsonl")
    assert isinstance(dataset["system_prompt"], str) and dataset["system_prompt"]
    for section in ("inference_model_config", "train_model_config"):
        assert not _unknown(kw[section], MODEL_KEYS) and kw[section]["path"]
    assert isinstance(kw["project_name"], str)  # launch.py calls project_name.replace(...)
    dp = kw["num_consumer_procs"] // (plugin.get("tp_size", 1) * plugin.get("pp_size", 1) * plugin.get("sp_size", 1))
    _check_sizes(kw, dp)


@pytest.mark.parametrize("legacy", LEGACY, ids=[p.stem for p in LEGACY])
def test_colossalchat_target_binds_for_every_legacy_strategy(legacy):
    m = migrate_file(legacy, target="colossalchat")
    flag = next((f for f in ("trainer_strategy", "strategy") if f'"--{f}"' in m.script), None)
    if flag is None:
        pytest.skip(f"{legacy.name} has no strategy flag")
    from coati_compat.migrate.emitted_colossalchat import LEGACY_STRATEGY_HYBRID

    for strategy in LEGACY_STRATEGY_HYBRID:
        try:
            kw = _kwargs(legacy, "colossalchat", **{flag: strategy})
        except ValueError:  # a choice the legacy flag does not offer
            continue
        colossalchat_stub().bind(**kw)
        assert not _unknown(kw["plugin_config"], HYBRID_PARALLEL_KEYS), strategy


@pytest.mark.parametrize("legacy", LEGACY, ids=[p.stem for p in LEGACY])
def test_default_target_binds_with_listed_extensions(legacy):
    kw = _kwargs(legacy, "coati_relay")
    engine_stub().bind(**kw)
    extensions = sorted(set(kw) - {name for name, _ in LAUNCH_PARAMETERS})
    assert set(extensions) <= set(ENGINE_EXTENSIONS), extensions
    # PPO with a critic stays this engine's (an extension of core_algo's values); a carried policy-gradient loss
    # without a critic (custom_trainer.py's) trains on RLOO's leave-one-out baseline instead
    expected = "RLOO" if legacy.stem == "custom_trainer" else "PPO"
    assert kw["core_algo"] == expected, f"{legacy.name}: core_algo {kw['core_algo']!r}, expected {expected!r}"
    backend = kw["inference_backend"]
    sections = {"generate_config": GENERATE_KEYS[backend], "grpo_config": GRPO_READ,
                "plugin_config": HYBRID_PARALLEL_KEYS, "train_model_config": MODEL_KEYS,
                "inference_model_config": MODEL_KEYS, "train_dataset_config": DATASET_KEYS}
    for section, known in sections.items():
        unknown = _unknown(kw[section], known, ENGINE_SECTION_EXTENSIONS.get(section, ()))
        assert not unknown, f"{section}: {unknown} is neither ColossalChat's nor a listed extension"


def test_the_written_script_names_the_one_line_to_change():
    script = migrate_file(ROOT / "examples" / "legacy" / "ppo_many_roles.py", target="colossalchat").script
    main = script[script.index("def main("):]
    assert "from coati_relay import launch_distributed" in main
    assert "#     from coati.distributed.launch import launch_distributed" in main
    assert not re.search(r"^\s*(from|import) coati_compat", script, re.M), "migrated scripts need nothing of ours"
    assert "critic_model_config" not in script.split("def launch_kwargs")[1]
