"""ColossalChat's training-side keys of `launch_distributed` mean here what they mean in ColossalChat's
``coati.distributed`` (ColossalAI 4f9953be3): ``plugin_config``, the learning-rate schedule, ``save_interval`` and
``save_dir``, ``tokenizer_config`` / ``train_model_config`` / ``inference_model_config`` passthrough,
``master_addr`` / ``master_port`` and ``enable_profiling``; what this host cannot run is named in one warning."""
from __future__ import annotations

import json
import socket
import warnings

import pytest
import torch
from small_run import small_run_kwargs

from coati_relay.assembly.build import ConfigError, HostDifferenceWarning, build_run_config
from coati_relay.checkpoint import save_due
from coati_relay.training.plugins import COLOSSALCHAT_PLUGIN_DEFAULTS, resolve_colossalchat
from coati_relay.training.schedule import (
    WarmupSchedule,
    colossalchat_cosine_rounds,
    colossalchat_factors,
    cosine_factor,
)


def _build(**kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = build_run_config(**kw)
    return cfg, [w for w in caught if issubclass(w.category, HostDifferenceWarning)]


# -- plugin_config -----------------------------------------------------------------------------------------------
def test_colossalchat_plugin_on_a_cuda_host_is_hybrid_with_its_defaults_updated_by_the_given():
    got = resolve_colossalchat({}, 2, cuda_available=True)
    assert (got.name, got.options, got.data_parallel, got.differences) == (
        "hybrid", {"tp_size": 1, "pp_size": 1, "precision": "bf16", "zero_stage": 2}, 2, ())
    got = resolve_colossalchat({"zero_stage": 1, "initial_scale": 2 ** 10}, 1, cuda_available=True)
    assert got.options == {**COLOSSALCHAT_PLUGIN_DEFAULTS, "zero_stage": 1, "initial_scale": 2 ** 10}
    # rl_example.py's form: microbatch_size only shapes a pipeline, max_norm is taken by the config (clipping)
    got = resolve_colossalchat({"tp_size": 1, "pp_size": 1, "microbatch_size": 2, "zero_stage": 0}, 1,
                               cuda_available=True)
    assert got.options == {"tp_size": 1, "pp_size": 1, "precision": "bf16", "zero_stage": 0}


def test_colossalchat_plugin_without_cuda_is_ddp_in_its_precision_and_says_so():
    got = resolve_colossalchat({"zero_stage": 2}, 2, cuda_available=False)
    assert (got.name, got.options, got.data_parallel) == ("ddp", {"precision": "bf16"}, 2)
    (text,) = got.differences
    assert "precision='bf16', zero_stage=2" in text and "TorchDDPPlugin, float32 weights" in text
    assert "bf16 autocast" in text
    got = resolve_colossalchat({"precision": "fp16"}, 1, cuda_available=False)  # no fp16 autocast without scaling
    assert got.options == {} and "TorchDDPPlugin, in fp32" in got.differences[0]
    # what HybridParallelPlugin would do in fp32 without ZeRO is what DDP does: no difference to name
    assert resolve_colossalchat({"zero_stage": 0, "precision": "fp32"}, 1, cuda_available=False).differences == ()
    with pytest.raises(ValueError, match="zero_stage > 0 needs precision"):
        resolve_colossalchat({"precision": "fp32"}, 1, cuda_available=False)


def test_model_parallel_sizes_keep_colossalchats_data_parallel_size():
    """tp*pp consumer processes of ColossalChat hold one model replica: here that many fewer processes train the
    whole model each, so the batch per optimizer step (train_batch_size * dp) is ColossalChat's."""
    got = resolve_colossalchat({"tp_size": 2, "pp_size": 2, "microbatch_size": 1}, 8, cuda_available=True)
    assert (got.name, got.data_parallel) == ("hybrid", 2)
    assert got.options == {"tp_size": 1, "pp_size": 1, "precision": "bf16", "zero_stage": 2}
    assert "tp_size=2, pp_size=2" in got.differences[0] and "2 data-parallel" in got.differences[0]
    with pytest.raises(ValueError, match="multiple of tp_size"):
        resolve_colossalchat({"tp_size": 3}, 4, cuda_available=True)


def test_launch_config_uses_the_colossalchat_plugin_and_warns_once(tiny_model_path, tmp_path):
    cfg, caught = _build(**small_run_kwargs(tmp_path, tiny_model_path, plugin_config={"zero_stage": 2,
                                                                                       "max_norm": 1.0}))
    assert (cfg.plugin.name, cfg.plugin.options, cfg.algo.max_grad_norm) == ("ddp", {"precision": "bf16"}, 1.0)
    assert len(caught) == 1 and "bf16 autocast" in str(caught[0].message)
    kw = small_run_kwargs(tmp_path, tiny_model_path, num_consumer_procs=2, train_batch_size=2,
                          train_minibatch_size=2, inference_microbatch_size=2, plugin_config={"tp_size": 2})
    cfg, caught = _build(**kw)
    assert cfg.roles.num_consumers == 1 and cfg.optimizer_steps_per_round == 2
    (warning,) = caught  # the model-parallel and the precision difference in one warning
    assert "tp_size=2" in str(warning.message) and "TorchDDPPlugin" in str(warning.message)
    cfg, caught = _build(**small_run_kwargs(tmp_path, tiny_model_path, plugin_config={"plugin": "ddp"}))
    assert cfg.plugin.name == "ddp" and caught == []  # the engine's own 'plugin' key: as named, no warning


def test_on_a_cuda_host_the_default_is_hybrid_bf16_zero2(tiny_model_path, tmp_path, monkeypatch):
    from coati_relay.training import plugins

    monkeypatch.setattr(plugins, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg, caught = _build(**small_run_kwargs(tmp_path, tiny_model_path))
    assert (cfg.plugin.name, cfg.plugin.options) == ("hybrid", COLOSSALCHAT_PLUGIN_DEFAULTS)
    assert caught == []


def test_a_critic_beside_the_hybrid_plugin_trains_with_the_same_zero_stage():
    from coati_relay.training.plugins import plugin_for_plain_module

    assert plugin_for_plain_module("hybrid", COLOSSALCHAT_PLUGIN_DEFAULTS) == ("zero2", {"stage": 2,
                                                                                       "precision": "bf16"})
    assert plugin_for_plain_module("hybrid", {**COLOSSALCHAT_PLUGIN_DEFAULTS, "zero_stage": 0}) == ("ddp", {})
    assert plugin_for_plain_module("ddp", {}) == ("ddp", {})


# -- learning rate ------------------------------------------------------------------------------------------------
def test_lr_follows_colossalais_cosine_annealing_warmup_lr_per_round():
    """ColossalChat: CosineAnnealingWarmupLR(total_steps=min(episodes, 4) * updates, warmup 0, eta_min=0.1*lr),
    stepped once per update; here the same values, one for all optimizer steps of a round."""
    from colossalai.nn.lr_scheduler import CosineAnnealingWarmupLR

    lr, rounds_per_episode, episodes, steps_per_round = 1e-3, 5, 6, 3
    total = colossalchat_cosine_rounds(episodes, rounds_per_episode)
    assert total == 20  # min(6, 4) * 5
    reference_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    reference = CosineAnnealingWarmupLR(reference_opt, total_steps=total, warmup_steps=0, eta_min=0.1 * lr)
    ours_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    rounds = episodes * rounds_per_episode
    ours = torch.optim.lr_scheduler.LambdaLR(ours_opt, WarmupSchedule("colossalchat", 0, total, 0.1,
                                                                      steps_per_round, rounds))
    for r in range(rounds):
        expected = reference_opt.param_groups[0]["lr"]
        for _ in range(steps_per_round):
            assert ours_opt.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12), r
            ours_opt.step()
            ours.step()
        reference_opt.step()
        reference.step()
    f = WarmupSchedule("colossalchat", 0, total, 0.1, steps_per_round, rounds)
    # round 0: lr (colossalai's recursion starts a little above it); T/2: about half-way; T: 0.1 lr
    assert 1.0 <= f(0) < 1.01
    assert f(10 * steps_per_round) == pytest.approx(0.55, abs=0.005)
    assert f(20 * steps_per_round) == pytest.approx(0.1, rel=1e-9)
    assert f(25 * steps_per_round) == pytest.approx(cosine_factor(25, 20, 0.1), rel=1e-9)  # past T it rises
    assert f(40 * steps_per_round) == pytest.approx(1.0)  # beyond the run's rounds: the closed form
    assert cosine_factor(10, 20, 0.1) == pytest.approx(0.55)


def test_the_default_schedule_is_colossalchats(tiny_model_path, tmp_path):
    cfg, _ = _build(**small_run_kwargs(tmp_path, tiny_model_path))
    assert cfg.algo.lr_scheduler == "colossalchat"
    with pytest.raises(ConfigError, match="warmup_steps.*'constant' or 'cosine'"):
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path,
                                            grpo_config={"lr": 1e-3, "warmup_steps": 2}))


def test_the_consumer_trains_round_r_at_colossalchats_lr(tiny_model_path, tmp_path):
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.training.booster_backend import load_causal_lm

    cfg, _ = _build(**small_run_kwargs(tmp_path, tiny_model_path, num_prompts=16, num_episodes=6,
                                       train_batch_size=2, train_minibatch_size=2))
    assert (cfg.rounds_per_episode, cfg.optimizer_steps_per_round) == (4, 2)
    worker = ConsumerWorker.for_models(cfg, load_causal_lm(tiny_model_path),
                                       reference=load_causal_lm(tiny_model_path))
    lrs = []
    for _ in range(cfg.total_rounds * cfg.optimizer_steps_per_round):
        lrs.append(worker.policy.optimizer.param_groups[0]["lr"])
        worker.policy.scheduler.step()
    factors = colossalchat_factors(16, 24, 0.1)  # T = min(6, 4) episodes * 4 rounds; 24 rounds
    assert lrs == pytest.approx([1e-3 * factors[s // 2] for s in range(len(lrs))], rel=1e-9)
    assert lrs[0] == pytest.approx(1e-3, rel=0.01) and lrs[2 * 16] == pytest.approx(1e-4, rel=1e-9)


# -- save_interval, save_dir --------------------------------------------------------------------------------------
def test_saves_follow_colossalchats_episode_steps():
    """ColossalChat saves after episode step s (0-based) when (s + 1) % save_interval == 0 or s is the episode's
    last; here after the global rounds that are those steps."""
    rounds_per_episode, episodes, interval = 5, 3, 2
    colossalchat = [e * rounds_per_episode + s + 1 for e in range(episodes) for s in range(rounds_per_episode)
                    if (s + 1) % interval == 0 or s + 1 == rounds_per_episode]
    ours = [r for r in range(1, episodes * rounds_per_episode + 1) if save_due(r, rounds_per_episode, interval)]
    assert ours == colossalchat == [2, 4, 5, 7, 9, 10, 12, 14, 15]
    assert [r for r in range(1, 7) if save_due(r, 3, 100)] == [3, 6]  # only each episode's end


def test_save_dir_defaults_to_colossalchats_model_folder(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default run_dir is runs/NAME under the working directory
    kw = small_run_kwargs(tmp_path, tiny_model_path)
    kw.pop("run_dir")
    cfg, _ = _build(**kw)
    assert str(cfg.checkpointing.save_dir) == "model" and str(cfg.checkpointing.run_dir) == "runs/coati-relay"
    cfg, _ = _build(**small_run_kwargs(tmp_path, tiny_model_path))  # the engine's run_dir given: under it
    assert cfg.checkpointing.save_dir == cfg.checkpointing.run_dir == tmp_path / "run"
    cfg, _ = _build(**small_run_kwargs(tmp_path, tiny_model_path, save_dir=str(tmp_path / "ck")))
    assert cfg.checkpointing.save_dir == tmp_path / "ck"


# -- passthrough to from_pretrained and AutoTokenizer ----------------------------------------------------------------
def keywords_of_from_pretrained(monkeypatch, auto_class) -> list:
    """The keywords of every later ``auto_class.from_pretrained`` call, appended to the returned list as the real
    method loads."""
    seen = []
    real = auto_class.from_pretrained.__func__

    def spy(cls, path, *args, **kwargs):
        seen.append(kwargs)
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(auto_class, "from_pretrained", classmethod(spy))
    return seen


def test_train_model_keys_reach_from_pretrained(tiny_model_path, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from coati_relay.roles.consumer import ConsumerWorker

    tmc = {"path": tiny_model_path, "use_flash_attention_2": True, "use_cache": False,
           "torch_dtype": torch.bfloat16, "checkpoint_path": None}
    cfg, caught = _build(**small_run_kwargs(tmp_path, tiny_model_path, train_model_config=tmc))
    assert cfg.models.train_model_kwargs == {"use_cache": False}
    (warning,) = caught
    assert "use_flash_attention_2" in str(warning.message) and "torch_dtype" in str(warning.message)
    seen = keywords_of_from_pretrained(monkeypatch, AutoModelForCausalLM)
    worker = ConsumerWorker(0, cfg, queue=None, weight_store=None)
    worker._load()
    assert [k.get("use_cache") for k in seen] == [False, False]  # the policy and the reference
    assert worker.policy.unwrapped().config.use_cache is False


def test_on_cuda_dtype_and_flash_attention_go_through(tiny_model_path, tmp_path, monkeypatch):
    import coati_relay.assembly.models as cm

    monkeypatch.setattr(cm, "flash_attention_available", lambda cuda: cuda)
    errors, differences = [], []
    got = cm.from_pretrained_kwargs(errors, "train_model_config", {"use_flash_attention_2": True,
                                                                  "torch_dtype": torch.bfloat16}, differences, True)
    assert got == {"attn_implementation": "flash_attention_2", "dtype": torch.bfloat16}
    assert errors == differences == []
    with pytest.raises(ConfigError, match=r"train_model_config\['torch_dtype'\] must be a torch dtype"):
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path,
                                            train_model_config={"path": tiny_model_path, "torch_dtype": "int8"}))


def test_inference_model_keys_of_rl_example_are_accepted(tiny_model_path, tmp_path):
    imc = {"path": tiny_model_path, "checkpoint_path": None, "use_flash_attention_2": True,
           "torch_dtype": torch.bfloat16}
    cfg, caught = _build(**small_run_kwargs(tmp_path, tiny_model_path, inference_model_config=imc))
    assert cfg.models.inference_model_kwargs == {"dtype": torch.bfloat16}
    assert "producers generate with the model's default attention" in str(caught[0].message)
    vllm = {"path": tiny_model_path, "checkpoint_path": None, "gpu_memory_utilization": 0.7, "enforce_eager": True,
            "enable_chunked_prefill": True, "max_model_len": 64}
    cfg, _ = _build(**small_run_kwargs(tmp_path, tiny_model_path, inference_backend="vllm",
                                       inference_model_config=vllm))
    assert cfg.models.inference_model_kwargs["enable_chunked_prefill"] is True


def test_tokenizer_config_keys_reach_auto_tokenizer(tiny_model_path, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from coati_relay.roles.producer import ProducerWorker

    tokc = {"path": tiny_model_path, "model_max_length": 77, "truncation_side": "left"}
    cfg, _ = _build(**small_run_kwargs(tmp_path, tiny_model_path, tokenizer_config=tokc))
    assert cfg.models.tokenizer_kwargs == {"model_max_length": 77, "truncation_side": "left"}
    seen = keywords_of_from_pretrained(monkeypatch, AutoTokenizer)
    producer = ProducerWorker(0, cfg, queue=None, weight_store=None)
    producer._load_prompts()
    assert seen == [{"model_max_length": 77, "truncation_side": "left"}]
    assert producer.tokenizer.model_max_length == 77 and producer.tokenizer.padding_side == "left"
    with pytest.raises(ConfigError, match="cannot load a tokenizer"):
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path,
                                            tokenizer_config={"path": tiny_model_path, "padding_side": "middle"}))


# -- master_addr, master_port ----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_consumers_meet_on_master_port(tiny_model_path, tmp_path, caplog):
    from coati_relay.roles.consumer import ConsumerWorker

    port = _free_port()
    cfg, _ = _build(**small_run_kwargs(tmp_path, tiny_model_path, master_addr="10.0.0.1", master_port=port))
    assert cfg.master_port == port
    worker = ConsumerWorker(0, cfg, queue=None, weight_store=None)
    addr, got, _ = worker.rendezvous()
    assert got == port and addr != "10.0.0.1"  # ColossalChat too uses rank 0's node IP, not master_addr
    other = ConsumerWorker(0, cfg, queue=None, weight_store=None)
    with caplog.at_level("WARNING", logger="coati_relay.training.rendezvous"):
        _, fallback, _ = other.rendezvous()  # the port is held by the first: a free one, with a warning
    assert fallback != port and f"master_port {port} is taken" in caplog.text
    with pytest.raises(ConfigError, match="master_port must be an int in 1..65535"):
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, master_port=70000))


# -- enable_profiling ----------------------------------------------------------------------------------------------
def test_profiling_writes_phase_timings_and_a_trace(tiny_model_path, tmp_path):
    """A colocated run with enable_profiling: every round's phases in run_dir/profile/<role>.jsonl, and a torch
    profiler trace of the consumer's first rounds."""
    from coati_relay.launch import launch_distributed

    kw = small_run_kwargs(tmp_path, tiny_model_path, num_prompts=12, colocate=True, enable_profiling=True,
                          progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostDifferenceWarning)
        result = launch_distributed(**kw)
    assert len(result.history) == 3
    profile = tmp_path / "run" / "profile"
    consumer = [json.loads(line) for line in (profile / "consumer-0.jsonl").read_text().splitlines()]
    producer = [json.loads(line) for line in (profile / "producer-0.jsonl").read_text().splitlines()]
    assert {(r["round"], r["phase"]) for r in consumer} >= {(r, p) for r in range(3) for p in ("step", "sync_model")}
    assert {(r["round"], r["phase"]) for r in producer} >= {(r, p) for r in range(3)
                                                            for p in ("rollout", "calculate_reward")}
    assert all(r["seconds"] >= 0 and r["start"] > 0 for r in consumer + producer)
    trace = json.loads((profile / "consumer-0.trace.json").read_text())
    assert trace["traceEvents"]
    off = small_run_kwargs(tmp_path / "off", tiny_model_path, colocate=True, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostDifferenceWarning)
        launch_distributed(**off)
    assert not (tmp_path / "off" / "run" / "profile").exists()


# -- project_name ----------------------------------------------------------------------------------------------------
def test_project_name_is_the_trackers_project_as_given(tiny_model_path, tmp_path, monkeypatch):
    """ColossalChat: wandb.init(project=project_name) as given; spaces become '_' only in file names."""
    from coati_relay.observe import trackers
    monkeypatch.chdir(tmp_path)
    kw = small_run_kwargs(tmp_path, tiny_model_path, project_name="my project", report_to=["wandb"])
    kw.pop("run_dir")
    cfg, _ = _build(**kw)
    assert cfg.project_name == "my project" and str(cfg.checkpointing.run_dir) == "runs/my_project"
    seen = []
    monkeypatch.setattr(trackers, "open_trackers", lambda report_to, run_dir, project, config: seen.append(project))
    trackers.open_run_trackers(cfg)
    assert seen == ["my project"]
