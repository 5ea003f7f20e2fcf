"""`legacy_reward_model`, the helper migrated four-role scripts import: a legacy ``RewardModel`` state dict
(``--rm_path``) becomes the sequence classifier ``reward_model_config["path"]`` loads, with the same scores."""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest
import torch

from coati_compat.migrate import migrate_file
from coati_relay.migration.from_legacy import legacy_reward_model
from coati_relay.rewards.reward_model import RewardModelScorer
from coati_relay.toy import build_tiny_model

LEGACY = Path(__file__).resolve().parents[3] / "examples" / "legacy"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("gpt2") / "model", arch="gpt2", hidden_size=64)


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    """A tiny random OPT (the four-role script's other family) with the toy tokenizer."""
    from transformers import OPTConfig, OPTForCausalLM

    from coati_relay.toy import build_tokenizer

    path, tokenizer = tmp_path_factory.mktemp("opt") / "model", build_tokenizer()
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=32, word_embed_proj_dim=32, ffn_dim=64,
                       num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    OPTForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def trained_reward_model(base, path, bias=0.0):
    """A legacy ``GPTRM`` or ``OPTRM`` on ``base`` with a seeded random head, saved as its state dict (as a training
    run did)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from coati.models.gpt import GPTRM
        from coati.models.opt import OPTRM
        from transformers import AutoConfig

        family = {"gpt2": GPTRM, "opt": OPTRM}[AutoConfig.from_pretrained(base).model_type]
        model = family(pretrained=str(base)).eval()
    torch.manual_seed(3)
    torch.nn.init.normal_(model.value_head.weight, std=0.5)
    torch.nn.init.constant_(model.value_head.bias, bias)
    torch.save(model.state_dict(), path)
    return model


@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_scores_equal_the_legacy_value_head_at_the_last_token(family, request, tmp_path):
    base = request.getfixturevalue(family)
    legacy = trained_reward_model(base, tmp_path / "rm.pt")
    out = legacy_reward_model(str(base), str(tmp_path / "rm.pt"))
    assert out == f"{tmp_path / 'rm.pt'}.relay" and os.path.isfile(os.path.join(out, "tokenizer.json"))
    sequences = torch.randint(6, 300, (3, 10))
    mask = torch.ones_like(sequences)
    mask[0, :4] = 0  # a left-padded row: the engine reads the last real token either way
    with torch.no_grad():
        values = legacy.value_head(legacy.model(sequences, attention_mask=mask).last_hidden_state).squeeze(-1)
    scores = RewardModelScorer(out)(sequences, mask)
    torch.testing.assert_close(scores, values[:, -1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(scores, legacy(sequences, mask)), "the legacy score is the mean over the positions"


def test_written_once_and_again_when_the_state_dict_is_newer(gpt2, tmp_path):
    trained_reward_model(gpt2, tmp_path / "rm.pt")
    out = legacy_reward_model(str(gpt2), str(tmp_path / "rm.pt"))
    written = os.path.getmtime(os.path.join(out, "config.json"))
    assert legacy_reward_model(str(gpt2), str(tmp_path / "rm.pt")) == out
    assert os.path.getmtime(os.path.join(out, "config.json")) == written
    time.sleep(0.01)
    trained_reward_model(gpt2, tmp_path / "rm.pt")
    os.utime(tmp_path / "rm.pt", (written + 5, written + 5))
    legacy_reward_model(str(gpt2), str(tmp_path / "rm.pt"))
    assert os.path.getmtime(os.path.join(out, "config.json")) > written


def test_a_legacy_bias_warns(gpt2, tmp_path):
    trained_reward_model(gpt2, tmp_path / "rm.pt", bias=0.25)
    with pytest.warns(UserWarning, match=r"bias \[0.25\] has no counterpart"):
        legacy_reward_model(str(gpt2), str(tmp_path / "rm.pt"))


@pytest.mark.parametrize("keys, error", [
    (lambda sd: {k: v for k, v in sd.items() if not k.startswith("value_head")}, "holds no 'value_head.weight'"),
    (lambda sd: {**sd, "model.h.0.attn.c_attn.lora_A": torch.zeros(2, 64)}, "a LoRA reward model must be merged"),
    (lambda sd: {k: v for k, v in sd.items() if not k.startswith("model.h.1.")}, "lacks weights of the GPT2Model"),
])
def test_bad_state_dicts_name_the_problem(gpt2, tmp_path, keys, error):
    trained_reward_model(gpt2, tmp_path / "rm.pt")
    torch.save(keys(torch.load(tmp_path / "rm.pt")), tmp_path / "rm.pt")
    with pytest.raises(ValueError, match=error):
        legacy_reward_model(str(gpt2), str(tmp_path / "rm.pt"))


def test_four_role_rm_path_maps_to_the_converted_checkpoint(gpt2, tmp_path):
    trained_reward_model(gpt2, tmp_path / "rm.pt")
    m = migrate_file(LEGACY / "four_role_ppo.py")
    args = {"pretrain": str(gpt2), "prompt_csv": "p.csv", "workers_per_role": 2, "num_episodes": 1}
    assert m.launch_kwargs(args)["reward_model_config"] == {"path": str(gpt2)}
    kw = m.launch_kwargs({**args, "rm_path": str(tmp_path / "rm.pt")})
    assert kw["reward_model_config"] == {"path": f"{tmp_path / 'rm.pt'}.relay"}
    assert "legacy_reward_model" in m.script and "DECIDE: the reward model" not in m.script
