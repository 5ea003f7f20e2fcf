"""``colocate``: the settings a colocated run cannot serve are refused in the driver, each naming the fix."""
from __future__ import annotations

import pytest

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.toy import build_tiny_model, write_toy_dataset


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_path):
    d = tmp_path_factory.mktemp("colocate-config")
    return {"dir": d, "data": str(write_toy_dataset(d / "p.jsonl", num_prompts=8)), "model": tiny_model_path}


def kwargs(files, **over):
    kw = dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"path": files["data"], "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": files["model"]}, train_model_config={"path": files["model"]},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0},
        grpo_config={"lr": 1e-3, "reward_fn_type": "toy_letter"},
        plugin_config={}, inference_backend="transformers", num_generations=4, run_dir=str(files["dir"] / "run"),
        colocate=True,
    )
    kw.update(over)
    return kw


def test_colocate_is_off_by_default_and_on_when_asked(files):
    assert build_run_config(**kwargs(files)).roles.colocate is True
    assert build_run_config(**{**kwargs(files), "colocate": False}).roles.colocate is False
    without = kwargs(files)
    del without["colocate"]
    assert build_run_config(**without).roles.colocate is False


@pytest.mark.parametrize("over,match", [
    (dict(colocate="yes"), r"colocate must be a bool"),
    (dict(num_producers=2, inference_batch_size=2, inference_microbatch_size=2, train_batch_size=4,
          train_minibatch_size=4), r"more ranks are not implemented yet.*num_producers=2"),
    (dict(num_consumer_procs=2, inference_microbatch_size=2, train_batch_size=2, train_minibatch_size=2),
     r"num_consumer_procs=2"),
    (dict(weight_sync="collective"), r"weight_sync='collective'.*colocate=False"),
    (dict(n_behind=1), r"n_behind=1.*on-policy"),
    (dict(on_producer_failure="continue"), r"on_producer_failure='continue'"),
    (dict(inference_model_config={"dtype": "bfloat16"}),
     r"takes only 'path' and 'fused_decode' and 'compiled_decode'; got \['dtype'\]"),
    (dict(train_model_config={"lora": {"r": 4}}), r"lora'\] is not implemented"),
])
def test_refusals_name_the_setting_and_the_fix(files, over, match):
    kw = kwargs(files, **over)
    if "inference_model_config" in over:
        kw["inference_model_config"] = {"path": files["model"], **over["inference_model_config"]}
    if "train_model_config" in over:
        kw["train_model_config"] = {"path": files["model"], **over["train_model_config"]}
    with pytest.raises(ConfigError, match=match):
        build_run_config(**kw)


def test_vllm_is_accepted_with_its_engine_settings(files):
    """A colocated vLLM engine holds its own copy of the weights, so it takes its engine settings (dtype, ...)."""
    cfg = build_run_config(**kwargs(files, inference_backend="vllm",
                                    inference_model_config={"path": files["model"], "dtype": "float32"}))
    assert cfg.roles.colocate and cfg.roles.inference_backend == "vllm"
    assert cfg.models.inference_model_kwargs == {"dtype": "float32"}


def test_transformers_takes_its_decode_keys(files):
    """A colocated transformers backend decodes the training module: of its keys it takes the decode step's."""
    cfg = build_run_config(**kwargs(files, inference_model_config={"path": files["model"], "fused_decode": False,
                                                                   "compiled_decode": False}))
    assert cfg.models.inference_model_kwargs == {"fused_decode": False, "compiled_decode": False}


@pytest.mark.parametrize("fused", [True, False])
def test_the_colocated_producer_decodes_with_the_step_asked_for(files, fused):
    from transformers import AutoModelForCausalLM

    from coati_relay.inference.fused_step import FusedStep, ModelStep
    from coati_relay.roles.producer import ProducerWorker

    cfg = build_run_config(**kwargs(files, inference_model_config={"path": files["model"], "fused_decode": fused}))
    producer = ProducerWorker(0, cfg, queue=None, weight_store=None)
    policy = AutoModelForCausalLM.from_pretrained(files["model"])
    producer.setup_colocated(policy)
    assert producer.backend.model is policy
    assert isinstance(producer.backend.step, FusedStep if fused else ModelStep)


def test_a_different_inference_model_is_refused(files):
    other = str(build_tiny_model(files["dir"] / "other-model", seed=1))
    with pytest.raises(ConfigError, match=r"inference_model_config\['path'\].*must be train_model_config\['path'\]"):
        build_run_config(**kwargs(files, inference_model_config={"path": other}))
