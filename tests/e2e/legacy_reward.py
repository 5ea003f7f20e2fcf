"""A trained legacy reward model, made the way a legacy user had one: a ``GPTRM`` (the body of a GPT-2 checkpoint
plus a value head) whose head was fitted, saved as the state dict a four-role script's ``--rm_path`` names.

It prefers plain lowercase text: the head is fitted by least squares on the body's hidden states [N*S, H] of toy
prompts followed by random tokens (a third of them letter tokens), to the share of lowercase letters and spaces in
the token at each position, times ``scale``; it has no bias, so the migrated classifier head (bias-free) is the same.
About a quarter of the toy vocabulary is such tokens (the rest are mostly single non-ASCII bytes), so a random
policy writes some and a few PPO steps raise their share. The reference ``RewardModel`` then reads about ``scale``
times that share over the whole sequence (prompt included), the engine's classifier the score of the last token:
both rise as the policy writes plain text.
"""
from __future__ import annotations

import string
import warnings
from pathlib import Path

import torch

from coati_relay.toy import toy_prompt_text

PLAIN = set(string.ascii_lowercase + " ")


def token_scores(tokenizer) -> torch.Tensor:
    """[V]: the share of lowercase letters and spaces in each token's text (0 for special and blank tokens)."""
    special = set(tokenizer.all_special_ids)
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    return torch.tensor([0.0 if i in special or not t.strip() else sum(c in PLAIN for c in t) / len(t)
                         for i, t in enumerate(texts)])


@torch.no_grad()
def fit_plain_text_reward_model(base: Path, out: Path, scale: float = 5.0, rows: int = 512, new_tokens: int = 12,
                                seed: int = 0) -> Path:
    """Writes the state dict of a ``GPTRM`` on ``base`` (a GPT-2 checkpoint with its tokenizer) to ``out``."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from coati.models.gpt import GPTRM

        model = GPTRM(pretrained=str(base)).eval()
    tokenizer = AutoTokenizer.from_pretrained(base)
    target = token_scores(tokenizer)
    plain_tokens = (target == 1).nonzero().squeeze(1)
    prompt = torch.tensor(tokenizer(toy_prompt_text("a"))["input_ids"])
    gen = torch.Generator().manual_seed(seed)
    responses = torch.randint(len(tokenizer.all_special_ids), len(tokenizer), (rows, new_tokens), generator=gen)
    chosen = torch.rand(rows, new_tokens, generator=gen) < 1 / 3
    responses[chosen] = plain_tokens[torch.randint(len(plain_tokens), (int(chosen.sum()),), generator=gen)]
    sequences = torch.cat([prompt.expand(rows, -1), responses], dim=1)
    hidden = model.model(sequences).last_hidden_state.flatten(0, 1)  # [N*S, H]
    weight = torch.linalg.lstsq(hidden, target[sequences].flatten().unsqueeze(1)).solution  # [H, 1]
    model.value_head.weight.copy_(weight.T * scale)
    torch.nn.init.zeros_(model.value_head.bias)
    torch.save(model.state_dict(), out)
    return out
