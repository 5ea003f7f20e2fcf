"""Tiny local models, tokenizers and the toy task, built on this machine (nothing is downloaded).

The toy task: every prompt asks for a letter; the reward of a response is the fraction of its characters that are
that letter (see `coati_relay.rewards.toy_letter_reward`). A randomly initialised 0.1M-parameter model starts near
0.05 and learns to raise it within a few dozen policy-gradient steps on CPU.
"""
from __future__ import annotations

import csv
import json
import os
import random
import string
from pathlib import Path
from typing import List, Optional

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
TOY_LETTERS = "aeiou"


def default_cache_dir() -> Path:
    return Path(os.environ.get("COATI_RELAY_CACHE", Path.home() / ".cache" / "coati-relay"))


def _corpus(n: int = 2000, seed: int = 0) -> List[str]:
    rng = random.Random(seed)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 6))) for _ in range(400)]
    lines = [toy_prompt_text(c) for c in TOY_LETTERS]
    lines += [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    lines += ["".join(c * rng.randint(1, 8) for c in TOY_LETTERS) for _ in range(50)]
    lines += [" ".join(str(rng.randint(0, 999)) for _ in range(5)) for _ in range(200)]
    return lines


def build_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer with chat special tokens, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_input_names=["input_ids", "attention_mask"],
        pad_token="<|pad|>", eos_token="<|eos|>", bos_token=None, unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def tiny_config(arch: str = "qwen2", vocab_size: int = 320, hidden_size: int = 128, num_layers: int = 2,
                pad_token_id: int = 0, eos_token_id: int = 1):
    """A transformers config of the tiny shape that vLLM's CPU kernels accept (head_dim 64); ``gpt2``: the legacy
    family of the four-role scripts, two heads, not meant for vLLM."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    if arch == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=num_layers, n_head=2, n_positions=512,
                          bos_token_id=eos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)

    common = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64, num_key_value_heads=1,
        max_position_embeddings=512, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
        bos_token_id=eos_token_id, tie_word_embeddings=False,
    )
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"tiny_config: unknown arch {arch!r}; use 'qwen2', 'llama' or 'gpt2'")


def build_tiny_model(path: Optional[os.PathLike] = None, arch: str = "qwen2", seed: int = 0,
                     hidden_size: int = 128, num_layers: int = 2) -> Path:
    """Writes a random tiny causal LM and its tokenizer to ``path`` (once) and returns the path.

    The default lands in the cache dir, keyed by the shape, so later calls return at once.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if path is None:
        path = default_cache_dir() / f"tiny-{arch}-h{hidden_size}-l{num_layers}-s{seed}"
    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tokenizer = build_tokenizer()
    config = tiny_config(arch, vocab_size=len(tokenizer), hidden_size=hidden_size, num_layers=num_layers,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return save_model_dir(model, tokenizer, path)


def save_model_dir(model, tokenizer, path: os.PathLike) -> Path:
    """Writes ``model`` and ``tokenizer`` as a ``from_pretrained`` directory at ``path`` atomically (a temporary
    sibling renamed into place; without a generation config, so sampling follows the run's settings). Where another
    process wrote ``path`` first, its copy stands (it is the same)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "generation_config.json").unlink(missing_ok=True)
    try:
        os.replace(tmp, path)
    except OSError:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def cache_as_hub_model(model_dir: os.PathLike, repo_id: str, cache_dir: Optional[os.PathLike] = None,
                       commit: Optional[str] = None) -> Path:
    """Files the model directory ``model_dir`` into a Hugging Face hub cache as ``repo_id`` ("ORG/NAME"), in the
    cache's own layout, so that runs (and tests) can name it by Hub ID offline; returns its snapshot directory.

    Layout: ``models--ORG--NAME/blobs/<sha256 of each file>``, ``snapshots/<commit>/<file>`` linking to its blob,
    ``refs/main`` holding ``<commit>``. ``cache_dir``: the cache (default: the one huggingface_hub would use now);
    ``commit``: 40 hex digits (default: derived from the files' hashes)."""
    import hashlib

    from coati_relay.config.hub import hub_cache_dir

    src = Path(model_dir)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"cache_as_hub_model: {src} holds no files")
    repo = Path(cache_dir if cache_dir is not None else hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    digests = {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    commit = commit or hashlib.sha1("".join(sorted(digests.values())).encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for f, digest in digests.items():
        blob = repo / "blobs" / digest
        if not blob.exists():
            blob.write_bytes(f.read_bytes())
        link = snapshot / f.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def toy_prompt_text(letter: str) -> str:
    return f"write the letter {letter} many times:"


def write_toy_dataset(path: os.PathLike, num_prompts: int = 64, letters: str = "a", seed: int = 0,
                      fmt: str = "jsonl") -> Path:
    """Writes toy-task prompts as ColossalChat jsonl (``{"messages": {...}, "gt_answer": letter}``) or as CSV."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [rng.choice(letters) for _ in range(num_prompts)]
    if fmt == "jsonl":
        with open(path, "w") as f:
            for letter in rows:
                f.write(json.dumps({"messages": {"role": "user", "content": toy_prompt_text(letter)},
                                    "gt_answer": letter}) + "\n")
    elif fmt == "csv":
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prompt", "gt_answer"])
            for letter in rows:
                w.writerow([toy_prompt_text(letter), letter])
    else:
        raise ValueError(f"write_toy_dataset: fmt must be 'jsonl' or 'csv', got {fmt!r}")
    return path
