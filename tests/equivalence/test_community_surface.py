"""The names the community ``train_prompts_on_ray.py`` (2023 and today's version) uses beyond the ``coati.ray``
examples, behaving as in the legacy code (legacy_spec §A.9, §A.10): ``ColossalAIStrategy``, ``coati.trainer.ppo.
_set_default_generate_kwargs``, ``generate`` on what ``strategy.prepare`` returns for an ``Actor``, the reward model
built from a critic's body and head, and ``transformers.BloomTokenizerFast``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from coati_compat.imports import finder

finder.install()
warnings.simplefilter("ignore", FutureWarning)


@pytest.mark.parametrize("kwargs,plugin,picked", [
    ({"stage": 3, "placement_policy": "cuda", "initial_scale": 2 ** 5},
     "gemini", {"placement_policy": "cuda", "initial_scale": 32, "precision": "fp16", "search_range_m": 32}),
    ({"stage": 2, "placement_policy": "cuda"},
     "zero2", {"stage": 2, "cpu_offload": False, "precision": "fp16", "reduce_bucket_size_in_m": 12.0}),
    ({"stage": 1, "placement_policy": "cpu", "precision": "fp32"},
     "zero2", {"stage": 1, "cpu_offload": True, "precision": "fp32"}),
])
def test_colossalai_strategy_maps_stages_to_plugins(monkeypatch, kwargs, plugin, picked):
    from coati.trainer.strategies import ColossalAIStrategy

    from coati_compat.legacy import strategies

    seen = {}
    monkeypatch.setattr(strategies._ColossalStrategy, "__init__",
                        lambda self, p, options, seed: seen.update(plugin=p, options=options, seed=seed))
    strategy = ColossalAIStrategy(**kwargs)
    assert strategy.stage == kwargs["stage"] and seen["plugin"] == plugin and seen["seed"] == 42
    assert {k: seen["options"][k] for k in picked} == picked


@pytest.mark.parametrize("kwargs,message", [({"stage": 4}, "stage must be 1, 2 or 3"),
                                            ({"precision": "bf16"}, "precision must be 'fp32' or 'fp16'"),
                                            ({"placement_policy": "auto"}, "placement_policy must be 'cpu' or 'cuda'")])
def test_colossalai_strategy_rejects_what_the_legacy_one_asserted(kwargs, message):
    from coati.trainer.strategies import ColossalAIStrategy

    with pytest.raises(ValueError, match=message):
        ColossalAIStrategy(**kwargs)


def test_bloom_tokenizer_fast_is_back_and_pads_left(tmp_path):
    """In a fresh interpreter, as a script meets it: the legacy imports first, then transformers'."""
    from coati_relay.toy import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    code = textwrap.dedent(f"""
        import warnings
        warnings.simplefilter("ignore")
        from coati.models.gpt import GPTActor
        from transformers import BloomTokenizerFast
        tokenizer = BloomTokenizerFast.from_pretrained({str(tmp_path)!r})
        batch = tokenizer(["a", "write the letter"], padding=True, return_tensors="pt")
        print(tokenizer.padding_side, int(batch["attention_mask"][0, 0]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["left", "0"]


def test_prepared_actor_generates_and_scores_as_in_the_script(tmp_path):
    """The script's actor-side calls on a DDP-prepared GPTActor, and its reward model from a GPTCritic, in a
    process of their own (the strategy starts torch.distributed)."""
    from coati_relay.training.distributed import free_port

    code = textwrap.dedent(f"""
        import copy, json, warnings, torch
        warnings.simplefilter("ignore")
        from coati.models.base import RewardModel
        from coati.models.gpt import GPTActor, GPTCritic
        from coati.trainer.ppo import _set_default_generate_kwargs
        from coati.trainer.strategies import ColossalAIStrategy, DDPStrategy
        from coati_compat.legacy.ray_utils import set_dist_env
        from transformers import GPT2Config
        set_dist_env(dict(rank="0", local_rank="0", world_size="1", master_addr="127.0.0.1",
                          master_port="{free_port()}"))
        cfg = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=64, pad_token_id=0,
                         eos_token_id=1)
        strategy = DDPStrategy()
        torch.manual_seed(0)
        actor = GPTActor(config=cfg)
        optim = torch.optim.Adam(actor.parameters(), lr=1e-3)
        actor, optim = strategy.prepare((actor, optim))
        kwargs = _set_default_generate_kwargs(strategy, {{"max_length": 12, "do_sample": True, "top_k": 5}}, actor)
        kwargs.update(pad_token_id=0, eos_token_id=1)
        prompts = torch.randint(2, 32, (3, 6))
        seq, attn, action = actor.generate(prompts, return_action_mask=True, **kwargs)
        log_probs = actor.forward(seq, action.size(1), attn)
        critic = GPTCritic(config=cfg).eval()  # the script puts every model in eval mode before making experience
        reward_model = RewardModel(copy.deepcopy(critic.model), copy.deepcopy(critic.value_head)).eval()
        zero2 = ColossalAIStrategy(stage=2, placement_policy="cuda")
        hf_class = type(strategy.unwrap_model(actor))
        print(json.dumps({{
            "hooks": kwargs["prepare_inputs_fn"].__func__ is hf_class.prepare_inputs_for_generation,
            "shapes": [list(seq.shape), list(attn.shape), list(action.shape), list(log_probs.shape)],
            "prompts_kept": torch.equal(seq[:, :6], prompts),
            "r_equals_value": torch.allclose(reward_model(seq, attn), critic(seq, None, attn)),
            "zero2_on_cpu": zero2.plugin_name, "colossalai_is_ddp_family": isinstance(zero2, DDPStrategy)}}))
    """)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"hooks": True, "shapes": [[3, 12], [3, 12], [3, 6], [3, 6]], "prompts_kept": True,
                   "r_equals_value": True, "zero2_on_cpu": "ddp", "colossalai_is_ddp_family": True}
