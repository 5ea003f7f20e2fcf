"""A tiny model whose sampled responses earn ColossalChat's ``think_answer_tags`` reward some of the time.

A random tiny model never writes ``<think>..</think><answer>..</answer>``, so every reward is 0 and GRPO has no
advantage to learn from. This fixture builds (once, cached by `FIXTURE_VERSION`):

- a byte-level BPE tokenizer whose vocabulary holds the four tags as single tokens (added, not special, so they
  survive ``skip_special_tokens`` decoding) and the digits, with a chat template that renders user and assistant
  turns and drops system messages (ColossalChat's drivers always send a long system prompt; a 0.3M-parameter model
  has no use for it, and dropping it keeps prompts a dozen tokens long);
- a tiny qwen2 model SFT'd for a few seconds on CPU on ``a+b=`` prompts (digits 0..4) answered as
  ``<think>a+b</think><answer>s</answer>`` + eos, where the answer is right with probability `P_RIGHT` and a random
  wrong digit otherwise: sampled at temperature 1 it is right about half the time, so rewards vary within a group;
- ColossalChat-format JSONL datasets (``{"messages": {"role": "user", "content": "3+1="}, "gt_answer": "4"}``,
  the fields `coati/dataset/loader.py` reads) for training and for two evaluation tasks.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Dict, List, Optional, Tuple

FIXTURE_VERSION = 1
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
SPECIAL_TOKENS = ["<|pad|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] != 'system' %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
P_RIGHT = 0.5
DIGITS = range(5)


def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def response_text(a: int, b: int, answer: int) -> str:
    return f"<think>{a}+{b}</think><answer>{answer}</answer>"


def _problems() -> List[Tuple[int, int]]:
    return [(a, b) for a in DIGITS for b in DIGITS]


def build_tokenizer():
    """Byte-level BPE over the task's text; the four tags are single added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [prompt_text(a, b) + response_text(a, b, a + b) for a, b in _problems()] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_input_names=["input_ids", "attention_mask"],
                                   pad_token="<|pad|>", eos_token="<|eos|>", bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def _chat_prompt(tokenizer, user: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                         tokenize=False)


def _sft_examples(tokenizer, n: int, rng: random.Random) -> List[List[int]]:
    out = []
    for _ in range(n):
        a, b = rng.choice(_problems())
        right = a + b
        answer = right if rng.random() < P_RIGHT else rng.choice([d for d in range(9) if d != right])
        text = _chat_prompt(tokenizer, prompt_text(a, b)) + response_text(a, b, answer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(ids + [tokenizer.eos_token_id])
    return out


def build_think_answer_model(path: Optional[os.PathLike] = None, steps: int = 150, seed: int = 0) -> Path:
    """Writes the SFT'd tiny model and its tokenizer to ``path`` (default: the cache) once; returns the path."""
    import torch
    from transformers import AutoModelForCausalLM

    from coati_relay.toy import default_cache_dir, save_model_dir, tiny_config

    path = Path(path) if path is not None else default_cache_dir() / f"think-answer-v{FIXTURE_VERSION}-s{seed}"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tokenizer = build_tokenizer()
    config = tiny_config("qwen2", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        batch = _sft_examples(tokenizer, 32, rng)
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for i, seq in enumerate(batch):
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, :len(seq)] = torch.tensor(seq)
        loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return save_model_dir(model, tokenizer, path)


def write_dataset(path: os.PathLike, num_prompts: int, seed: int = 0) -> Path:
    """ColossalChat JSONL: one ``{"messages": {role, content}, "gt_answer": str}`` per line."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for _ in range(num_prompts):
            a, b = rng.choice(_problems())
            f.write(json.dumps({"messages": {"role": "user", "content": prompt_text(a, b)},
                                "gt_answer": str(a + b)}) + "\n")
    return path


def write_datasets(root: os.PathLike, num_train: int = 8, num_eval: int = 4) -> Dict[str, Path]:
    """``train``, ``task1``, ``task2`` JSONL files under ``root``."""
    root = Path(root)
    return {"train": write_dataset(root / "train.jsonl", num_train, seed=1),
            "task1": write_dataset(root / "eval_task1.jsonl", num_eval, seed=2),
            "task2": write_dataset(root / "eval_task2.jsonl", num_eval, seed=3)}


def sample_rewards(model_dir: os.PathLike, num_prompts: int = 8, num_generations: int = 8,
                   seed: int = 0) -> List[List[float]]:
    """Samples ``num_generations`` responses per prompt (temperature 1, top_k 50, stop at ``</answer>``) and scores
    them with the engine's ``think_answer_tags`` reward; returns the rewards, [num_prompts][num_generations]."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati_relay.rewards.math_rewards import think_answer_reward

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    groups = []
    for _ in range(num_prompts):
        a, b = rng.choice(_problems())
        ids = tokenizer(_chat_prompt(tokenizer, prompt_text(a, b)), add_special_tokens=False,
                        return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids.repeat(num_generations, 1), do_sample=True, top_k=50, temperature=1.0,
                                 max_new_tokens=24, stop_strings=["</answer>"], tokenizer=tokenizer,
                                 pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        groups.append(think_answer_reward(texts, [str(a + b)] * num_generations, []).tolist())
    return groups


if __name__ == "__main__":  # prints the reward spread of the fixture
    import statistics
    import time

    t0 = time.time()
    d = build_think_answer_model()
    print("model", d, f"built in {time.time() - t0:.1f}s")
    groups = sample_rewards(d)
    flat = [r for g in groups for r in g]
    print("mean", statistics.mean(flat), "std", statistics.pstdev(flat),
          "groups with variance", sum(len(set(g)) > 1 for g in groups), "of", len(groups))
    for g in groups:
        print(g)
