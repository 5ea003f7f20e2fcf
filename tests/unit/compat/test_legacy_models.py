"""The legacy models, generation, experience maker, strategies, callbacks and quant helpers on tiny CPU models."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from coati_compat.imports import finder
from coati_compat.legacy.callbacks import ExperienceMakerPerformanceEvaluator, TrainerPerformanceEvaluator
from coati_compat.legacy.experience_maker import NaiveExperienceMaker
from coati_compat.legacy.generation import generate
from coati_compat.legacy.lora import LoraLinear
from coati_compat.legacy.model_families import GPTRM, GPTActor, GPTCritic
from coati_compat.legacy.quant import llama_load_quant, low_resource_init
from coati_compat.legacy.ray_utils import (
    get_actor_from_args,
    get_critic_from_args,
    get_strategy_from_args,
    get_tokenizer_from_args,
    set_dist_env,
)
from coati_compat.legacy.strategies import NaiveStrategy
from coati_compat.reference import experience as ref_exp

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

REPO = Path(__file__).resolve().parents[3]
VOCAB, PAD, EOS = 48, 0, 1
TOL = dict(rtol=1e-5, atol=1e-6)


def tiny_gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=EOS,
                      eos_token_id=EOS, pad_token_id=PAD, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = tiny_gpt2_config()
    return {"actor": GPTActor(config=cfg), "initial": GPTActor(config=cfg),
            "critic": GPTCritic(config=cfg, use_action_mask=True), "rm": GPTRM(config=cfg)}


def _prompts(batch: int = 3, length: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = PAD, 0  # one left-padded prompt
    return ids, mask


def test_actor_forward_returns_log_probs_of_the_last_actions(models):
    actor = models["actor"]
    seq = torch.randint(0, VOCAB, (4, 11))
    mask = torch.ones_like(seq)
    log_probs = actor(seq, 5, attention_mask=mask)
    logits = actor.model(input_ids=seq, attention_mask=mask).logits
    direct = F.log_softmax(logits, dim=-1)[:, :-1].gather(-1, seq[:, 1:, None]).squeeze(-1)[:, -5:]
    assert log_probs.shape == (4, 5)
    torch.testing.assert_close(log_probs, direct, **TOL)
    torch.testing.assert_close(actor(seq, attention_mask=mask).logits, logits, **TOL)
    full = F.log_softmax(logits, dim=-1)[:, :-1].gather(-1, seq[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(actor(seq, 11, attention_mask=mask), full, **TOL)  # legacy [:, -11:] of 10 columns
    with pytest.raises(ValueError, match="num_actions"):
        actor(seq, 0, attention_mask=mask)


def test_critic_values_prompt_mean_with_action_mask(models):
    critic = models["critic"]
    seq = torch.randint(0, VOCAB, (3, 10))
    mask = torch.ones_like(seq)
    mask[0, :3] = 0
    action_mask = torch.ones(3, 4, dtype=torch.bool)
    values = critic.value_head(critic.model(input_ids=seq, attention_mask=mask).last_hidden_state).squeeze(-1)
    prompt = mask[:, :6].float()
    torch.testing.assert_close(critic(seq, action_mask=action_mask, attention_mask=mask),
                               (values[:, :6] * prompt).sum(1) / prompt.sum(1), **TOL)
    torch.testing.assert_close(critic(seq, attention_mask=mask), values[:, :-1].mean(1), **TOL)
    assert models["rm"](seq, mask).shape == (3,)


def test_factories_and_lora():
    cfg = tiny_gpt2_config()
    actor = get_actor_from_args("gpt2", config=cfg, lora_rank=2)
    trainable = [n for n, p in actor.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert isinstance(actor.model.lm_head, LoraLinear)
    assert get_critic_from_args("gpt2", config=cfg).use_action_mask is True
    with pytest.raises(ValueError, match="Unsupported actor model"):
        get_actor_from_args("t5")
    with pytest.raises(ValueError, match="Unsupported strategy"):
        get_strategy_from_args("colossalai_zero3")
    with pytest.raises(ValueError, match="not a local checkpoint"):
        GPTActor(pretrained="no-such-org/no-such-model")


def test_lora_linear_merges_on_its_own_eval_as_the_legacy_layer():
    torch.manual_seed(0)
    layer = LoraLinear(torch.nn.Parameter(torch.randn(5, 7)), torch.nn.Parameter(torch.randn(5)), r=2,
                       lora_alpha=4, merge_weights=True)
    torch.nn.init.normal_(layer.lora_B)
    x = torch.randn(3, 7)
    w0 = layer.weight.detach().clone()
    merged_weight = w0 + (layer.lora_B @ layer.lora_A).detach() * 2.0  # scaling = 4 / 2
    out_train = layer(x)
    torch.nn.Sequential(layer).eval()  # a parent's eval() reaches the layer as train(False): no merge
    assert not layer.merged and torch.equal(layer.weight, w0)
    layer.eval()
    assert layer.merged and not hasattr(layer, "lora_A") and not hasattr(layer, "lora_B")
    torch.testing.assert_close(layer.weight, merged_weight, **TOL)
    torch.testing.assert_close(layer(x), out_train, **TOL)
    layer.train()  # a fresh adapter (B = 0) over the merged weight, not the weight before the merge
    assert not layer.merged and torch.equal(layer.lora_B, torch.zeros(5, 2)) and layer.lora_A.shape == (2, 7)
    assert not torch.allclose(layer.weight, w0)
    torch.testing.assert_close(layer(x), out_train, **TOL)
    wide = LoraLinear(torch.nn.Parameter(torch.randn(1, 3)), None, r=4)  # legacy allowed r > min(in, out)
    assert wide.lora_A.shape == (4, 3) and wide.lora_B.shape == (1, 4)
    with pytest.raises(ValueError, match="r must be an int >= 0"):
        LoraLinear(torch.nn.Parameter(torch.randn(2, 3)), None, r=-1)


def test_lora_linear_fan_in_fan_out_takes_out_in_and_stores_it_transposed():
    torch.manual_seed(0)
    weight = torch.randn(5, 7)  # [out, in], as the legacy layer read it
    layer = LoraLinear(torch.nn.Parameter(weight.clone()), None, r=2, fan_in_fan_out=True, merge_weights=False)
    assert layer.weight.shape == (7, 5) and (layer.in_features, layer.out_features) == (7, 5)
    assert layer.lora_A.shape == (2, 7) and layer.lora_B.shape == (5, 2)
    x = torch.randn(3, 7)
    torch.testing.assert_close(layer(x), x @ weight.T, **TOL)
    torch.nn.init.normal_(layer.lora_B)
    expected = x @ weight.T + x @ layer.lora_A.T @ layer.lora_B.T * layer.scaling
    torch.testing.assert_close(layer(x), expected, **TOL)


class _AlwaysEos(torch.nn.Module):
    """A stateless toy LM that puts almost all probability on EOS."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
        logits = torch.zeros(*input_ids.shape, VOCAB)
        logits[..., EOS] = 50.0
        return {"logits": logits, "past_key_values": None}


def test_generate_pads_finished_rows_and_stops_early(models):
    ids, mask = _prompts()
    toy = _AlwaysEos()
    stopped = generate(toy, ids, max_length=20, early_stopping=True, eos_token_id=EOS, pad_token_id=PAD)
    assert stopped.shape == (3, 7) and (stopped[:, 6] == EOS).all()
    full = generate(toy, ids, max_length=20, eos_token_id=EOS, pad_token_id=PAD)
    assert full.shape == (3, 20) and (full[:, 7:] == PAD).all()
    torch.manual_seed(1)
    seq = generate(models["actor"].model, ids, max_length=12, eos_token_id=EOS, pad_token_id=PAD, top_k=10,
                   top_p=0.9, temperature=0.8, attention_mask=mask)
    assert torch.equal(seq[:, :6], ids) and seq.size(1) == 12
    with pytest.raises(NotImplementedError, match="samples only"):
        generate(models["actor"].model, ids, max_length=10, do_sample=False)
    with pytest.raises(ValueError, match="pad_token_id"):
        generate(models["actor"].model, ids, max_length=10, eos_token_id=EOS)


def _tiny_family_configs():
    from transformers import BloomConfig, LlamaConfig, OPTConfig

    return {
        "gpt2": tiny_gpt2_config(),
        "bloom": BloomConfig(n_layer=1, hidden_size=16, n_head=2, vocab_size=VOCAB),
        "opt": OPTConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, ffn_dim=32, vocab_size=VOCAB,
                         max_position_embeddings=32, word_embed_proj_dim=8),
        "llama": LlamaConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=32, vocab_size=VOCAB),
    }


@pytest.mark.parametrize("family", ["gpt2", "bloom", "opt", "llama"])
def test_every_family_generates_and_scores(family):
    cfg = _tiny_family_configs()[family]
    actor = get_actor_from_args(family, config=cfg, lora_rank=2)
    critic = get_critic_from_args(family, config=cfg)
    ids, mask = _prompts()
    seq, attention_mask, action_mask = actor.generate(ids, max_length=10, eos_token_id=EOS, pad_token_id=PAD,
                                                      attention_mask=mask)
    assert seq.shape == (3, 10) and action_mask.shape == (3, 4)
    assert actor(seq, 4, attention_mask).shape == (3, 4)
    assert critic(seq, action_mask, attention_mask).shape == (3,)


def test_actor_generate_masks_match_the_reference(models):
    ids, mask = _prompts()
    torch.manual_seed(2)
    seq, attention_mask, action_mask = models["actor"].generate(ids, max_length=16, eos_token_id=EOS,
                                                                pad_token_id=PAD, attention_mask=mask)
    assert torch.equal(attention_mask, ref_exp.attention_mask_of(seq, PAD))
    assert torch.equal(action_mask, ref_exp.action_mask_of(seq, ids.size(1), EOS))


def test_experience_maker_matches_the_reference_step(models):
    maker = NaiveExperienceMaker(models["actor"], models["critic"], models["rm"], models["initial"], 0.3)
    ids, mask = _prompts()
    torch.manual_seed(3)
    exp = maker.make_experience(ids, attention_mask=mask, max_length=14, eos_token_id=EOS, pad_token_id=PAD)
    assert exp.advantages.shape == (3, 1) and exp.values.shape == exp.reward.shape == (3,)
    ref = ref_exp.experience_from_sequences(
        models["actor"].model, models["initial"].model, models["critic"].model, models["critic"].value_head,
        models["rm"].model, models["rm"].value_head, exp.sequences, ids.size(1), PAD, EOS, kl_coef=0.3)
    for key in ref_exp.FIELDS:
        torch.testing.assert_close(getattr(exp, key), ref[key], **TOL)
    with pytest.raises(TypeError, match="kl_coef must be a number"):
        NaiveExperienceMaker(models["actor"], models["critic"], models["rm"], models["initial"], object())


def test_naive_strategy_trains_on_cpu(models):
    strategy = NaiveStrategy()
    actor = get_actor_from_args("gpt2", config=tiny_gpt2_config())
    optim = torch.optim.Adam(actor.parameters(), lr=1e-2)
    actor, optim = strategy.prepare((actor, optim))
    assert strategy.unwrap_model(actor) is actor.model
    before = actor.model.lm_head.weight.detach().clone()
    seq = torch.randint(0, VOCAB, (2, 8))
    loss = -actor(seq, 3, attention_mask=torch.ones_like(seq)).mean()
    strategy.backward(loss, actor, optim)
    strategy.optimizer_step(optim)
    assert not torch.equal(before, actor.model.lm_head.weight)
    shards = list(strategy.get_model_state_dict_shard(actor, shard_size=4096))
    assert len(shards) > 1 and all(not k.startswith("model.") for s in shards for k in s)
    assert sum(len(s) for s in shards) == len(actor.model.state_dict())
    sampler = strategy.setup_sampler(list(range(10)))
    assert len(set(sampler.sample(4))) == 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_and_zero_strategies_on_cpu(tmp_path):
    """DDP through the engine's plugin (own process: it initialises torch.distributed); zero2 falls back to ddp."""
    code = textwrap.dedent(f"""
        import json, warnings, torch
        warnings.simplefilter("ignore", FutureWarning)
        from transformers import GPT2Config
        from coati_compat.legacy.ray_utils import (get_actor_from_args, get_critic_from_args,
                                                   get_strategy_from_args, set_dist_env)
        from coati_compat.legacy.strategies import DDPStrategy, LowLevelZeroStrategy
        set_dist_env(dict(rank="0", local_rank="0", world_size="1", master_addr="127.0.0.1",
                          master_port="{_free_port()}"))
        cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32)
        strategy = DDPStrategy()
        actor, critic = get_actor_from_args("gpt2", config=cfg), get_critic_from_args("gpt2", config=cfg)
        optim = torch.optim.Adam(actor.parameters(), lr=1e-2)
        (actor, optim), frozen = strategy.prepare((actor, optim), critic.requires_grad_(False))
        seq = torch.randint(0, 32, (2, 8))
        before = strategy.unwrap_model(actor).lm_head.weight.detach().clone()
        loss = -actor(seq, 3, attention_mask=torch.ones_like(seq)).mean()
        strategy.backward(loss, actor, optim)
        strategy.optimizer_step(optim)
        hf = strategy.unwrap_model(actor)
        keys = list(next(strategy.get_model_state_dict_shard(actor)))
        strategy.save_model(actor, "{tmp_path}/actor.pt", only_rank0=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            zero = LowLevelZeroStrategy(stage=2, placement_policy="cpu")
            gemini = get_strategy_from_args("colossalai_gemini_cpu")
        print(json.dumps({{
            "changed": not torch.equal(before, hf.lm_head.weight), "hf": type(hf).__name__,
            "hf_keys": keys == list(hf.state_dict()), "frozen_unwrapped": frozen is critic,
            "saved": __import__("os").path.exists("{tmp_path}/actor.pt"), "zero_plugin": zero.plugin_name,
            "gemini_plugin": gemini.plugin_name,
            "fallback_warned": sum("needs CUDA" in str(w.message) for w in caught)}}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "backend"), str(REPO / "compat")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"changed": True, "hf": "GPT2LMHeadModel", "hf_keys": True, "frozen_unwrapped": True,
                   "saved": True, "zero_plugin": "ddp", "gemini_plugin": "ddp", "fallback_warned": 2}


def test_strategies_need_the_distributed_environment():
    """In a fresh process (this one may already hold a process group): no RANK etc. -> a clear error."""
    code = textwrap.dedent("""
        from coati_compat.legacy.ray_utils import get_strategy_from_args
        try:
            get_strategy_from_args("ddp")
        except ValueError as e:
            print("ValueError:", e)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "backend"), str(REPO / "compat")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ValueError:" in proc.stdout and "environment variables" in proc.stdout


def test_set_dist_env_validates(monkeypatch):
    monkeypatch.setenv("RANK", "7")
    with pytest.raises(TypeError, match="must be strings"):
        set_dist_env(dict(rank=0, local_rank="0", world_size="1", master_addr="x", master_port="1"))
    with pytest.raises(ValueError, match="lacks"):
        set_dist_env(dict(rank="0"))
    assert os.environ["RANK"] == "7"


def test_tokenizer_from_local_path_or_clear_error(tiny_model_path):
    tokenizer = get_tokenizer_from_args("llama", pretrain=tiny_model_path)
    assert tokenizer.pad_token == tokenizer.eos_token
    with pytest.raises(ValueError, match="pretrain"):
        get_tokenizer_from_args("llama")
    from huggingface_hub import try_to_load_from_cache

    if try_to_load_from_cache("facebook/opt-350m", "tokenizer_config.json") is None:
        with pytest.raises(ValueError, match="nothing is downloaded"):
            get_tokenizer_from_args("opt")


def test_performance_evaluators_without_torch_distributed(models, capsys):
    maker_eval = ExperienceMakerPerformanceEvaluator(10, 10, 10, 10)
    trainer_eval = TrainerPerformanceEvaluator(10, 10, ignore_first_episodes=1)
    ids, mask = _prompts()
    maker = NaiveExperienceMaker(models["actor"], models["critic"], models["rm"], models["initial"])
    exp = maker.make_experience(ids, attention_mask=mask, max_length=10, eos_token_id=EOS, pad_token_id=PAD)
    maker_eval.on_batch_start()
    maker_eval.on_make_experience_start()
    maker_eval.on_make_experience_end(exp)
    maker_eval.on_send_start()
    maker_eval.on_send_end()
    maker_eval.on_batch_end()
    maker_eval.on_loop_end()
    assert maker_eval.summary["samples"] == 3 and maker_eval.summary["throughput_samples_per_s"] > 0
    for episode in range(2):
        trainer_eval.on_episode_start(episode)
        trainer_eval.on_batch_start()
        trainer_eval.on_batch_end({}, exp)
        trainer_eval.on_update_start()
        trainer_eval.on_update_end()
    trainer_eval.on_fit_end()
    assert trainer_eval.summary["samples"] == 3
    assert "[trainer performance]" in capsys.readouterr().out
    empty = TrainerPerformanceEvaluator(1, 1)
    empty.on_fit_end()
    assert "No samples are collected" in capsys.readouterr().out


def test_quant_and_moved_transformers_names():
    with pytest.raises(NotImplementedError, match="quantization_config"):
        llama_load_quant(None, "ckpt.pt", 4, 128)
    original = torch.nn.init.normal_
    with low_resource_init():
        assert torch.nn.init.normal_ is not original
        layer = torch.nn.Linear(4, 4)
    assert torch.nn.init.normal_ is original and layer.weight.shape == (4, 4)
    finder.install()
    import coati.quant  # noqa: F401  (importing the legacy surface restores the moved names)
    from transformers.modeling_utils import no_init_weights

    with no_init_weights():
        pass
