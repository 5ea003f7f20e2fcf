"""generate_config means what the backend in use means (ColossalChat hands it whole to transformers' generate() or
vllm.SamplingParams): each key's fate per backend, the error for a key the backend does not know, and the required
temperature/top_p."""
from __future__ import annotations

import inspect

import pytest

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.assembly.sampling import build_sampling
from coati_relay.inference.generate_keys import VLLM_SAMPLING_KEYS, classify
from coati_relay.toy import write_toy_dataset

REQUIRED = {"temperature": 1.0, "top_p": 1.0}


def _sampling(gen, backend, core_algo="GRPO", prompt_tokens=32):
    errors = []
    return build_sampling(errors, dict(gen), {}, backend, core_algo, prompt_tokens), errors


@pytest.mark.slow  # imports vLLM (about 17 s)
def test_vllm_key_table_is_the_installed_sampling_params():
    vllm = pytest.importorskip("vllm")
    installed = {p for p in inspect.signature(vllm.SamplingParams).parameters if not p.startswith("_")}
    assert installed == set(VLLM_SAMPLING_KEYS)


def test_colossalchat_transformers_example_config():
    # rl_example.py's transformers generate_config (think_answer_tags): every key taken, with its meaning
    gen = {"top_k": 50, "top_p": 0.9, "temperature": 0.8, "max_length": 40, "do_sample": True, "max_new_tokens": None,
           "early_stopping": False, "stop_strings": ["</answer>"]}
    s, errors = _sampling(gen, "transformers")
    assert errors == []
    assert (s.max_new_tokens, s.stop_strings, s.do_sample, s.options) == (8, ["</answer>"], True, {})
    assert (s.temperature, s.top_p, s.top_k) == (0.8, 0.9, 50)
    assert not _sampling({**gen, "do_sample": False}, "transformers")[0].do_sample


def test_colossalchat_vllm_example_config():
    # rl_example.py's vLLM generate_config (think_answer_tags): stop reaches the engine, the rest goes to vLLM
    gen = {"top_k": -1, "top_p": 1.0, "temperature": 1.0, "max_tokens": 12, "ignore_eos": True,
           "include_stop_str_in_output": True, "stop": ["</answer>"]}
    s, errors = _sampling(gen, "vllm")
    assert errors == []
    assert (s.max_new_tokens, s.ignore_eos, s.stop_strings) == (12, True, ["</answer>"])
    assert s.options == {"include_stop_str_in_output": True}
    s, errors = _sampling({**gen, "stop": None, "min_tokens": 3, "repetition_penalty": 1.1}, "vllm")
    assert errors == [] and s.stop_strings == []
    assert s.options == {"include_stop_str_in_output": True, "min_tokens": 3, "repetition_penalty": 1.1}


@pytest.mark.parametrize("backend, key, value, words", [
    ("transformers", "stop", ["</a>"], ["'stop'", "inference_backend='vllm' knows it", "'stop_strings'"]),
    ("transformers", "include_stop_str_in_output", True, ["inference_backend='vllm' knows it"]),
    ("transformers", "repetition_penalty", 1.1, ["transformers generate() key", "its own loop",
                                                 "use inference_backend='vllm', which knows it"]),
    ("vllm", "stop_strings", ["</a>"], ["inference_backend='transformers' knows it", "'stop'"]),
    ("vllm", "do_sample", True, ["inference_backend='transformers' knows it"]),
    ("vllm", "max_length", 40, ["inference_backend='transformers' knows it", "max_tokens"]),
    ("vllm", "early_stopping", True, ["inference_backend='transformers' knows it"]),
    ("vllm", "detokenize", True, ["the engine sets itself"]),
    ("vllm", "stop_sequence", ["x"], ["neither transformers' generate() nor vllm.SamplingParams knows it"]),
    ("transformers", "max_lenght", 8, ["did you mean 'max_length'", "neither"]),
])
def test_a_key_the_backend_does_not_know_is_an_error_naming_who_knows_it(backend, key, value, words):
    _, errors = _sampling({**REQUIRED, key: value}, backend)
    (error,) = errors
    assert f"generate_config has key {key!r}" in error
    for w in words:
        assert w in error, (w, error)


def test_temperature_and_top_p_are_required_for_colossalchat_algorithms():
    for algo in ("GRPO", "DAPO", "RLOO", "REINFORCE_PPB"):
        _, errors = _sampling({"max_new_tokens": 4}, "transformers", algo)
        (error,) = errors
        assert "generate_config needs 'temperature' and 'top_p'" in error and "KeyError" in error
    _, errors = _sampling({"max_new_tokens": 4, "temperature": 0.7}, "vllm")
    assert errors and "needs 'top_p'" in errors[0] and "'temperature'" not in errors[0].split(":")[0]
    s, errors = _sampling({"max_new_tokens": 4}, "transformers", "PPO")  # the extension keeps its defaults
    assert errors == [] and (s.temperature, s.top_p) == (1.0, 1.0)


def test_max_length_and_beams_checked():
    _, errors = _sampling({**REQUIRED, "max_length": 32}, "transformers")
    assert "generate_config['max_length']" in errors[0] and "train_dataset_config['max_length'] = 32" in errors[0]
    s, errors = _sampling({**REQUIRED, "max_length": 40, "max_new_tokens": 5}, "transformers")
    assert errors == [] and s.max_new_tokens == 5  # max_new_tokens wins, as in transformers
    _, errors = _sampling({**REQUIRED, "num_beams": 4}, "transformers")
    assert "num_beams" in errors[0]
    _, errors = _sampling({**REQUIRED, "stop_strings": [""]}, "transformers")
    assert "stop_strings" in errors[0]


def test_forced_keys_have_no_effect():
    assert classify("vllm", "n")[0] == classify("vllm", "logprobs")[0] == "forced"
    assert classify("transformers", "output_logits")[0] == "forced"


def test_launch_refuses_before_any_actor(tiny_model_path, tmp_path):
    data = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=8)
    kw = dict(num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
              inference_batch_size=2, inference_microbatch_size=2, train_batch_size=2, train_minibatch_size=2,
              train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
              inference_model_config={"path": tiny_model_path}, train_model_config={"path": tiny_model_path},
              grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter"}, plugin_config={}, num_generations=2,
              run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="generate_config has key 'stop'.*'stop_strings'"):
        build_run_config(**kw, generate_config={**REQUIRED, "max_new_tokens": 4, "stop": ["</answer>"]},
                         inference_backend="transformers")
    with pytest.raises(ConfigError, match="generate_config needs 'temperature' and 'top_p'"):
        build_run_config(**kw, generate_config={"max_new_tokens": 4}, inference_backend="transformers")
    cfg = build_run_config(**kw, generate_config={**REQUIRED, "max_new_tokens": 4, "stop_strings": "</answer>"},
                           inference_backend="transformers")
    assert cfg.sampling.stop_strings == ["</answer>"]


@pytest.mark.parametrize("off", [0, -1])
def test_top_k_zero_and_minus_one_both_mean_off(off):
    """transformers' generate() switches top-k off with 0 (ColossalChat's migrated transformers configs), vLLM with
    -1: both are the engine's -1."""
    errors = []
    sampling = build_sampling(errors, {"top_k": off, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4}, {},
                              backend="transformers", prompt_tokens=8)
    assert errors == [] and sampling.top_k == -1
