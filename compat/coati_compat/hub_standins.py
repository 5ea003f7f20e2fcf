"""Tiny local stand-ins for the hub tokenizers that ColossalChat's legacy scripts and tests load by name.

``python -m coati_compat.hub_standins DIR`` writes, for each name of ``STANDINS`` (``gpt2``, ``facebook/opt-350m``,
``bigscience/bloom-560m``, ``hf-internal-testing/llama-tokenizer``), a small tokenizer into ``DIR`` laid out as a
Hugging Face hub cache (``DIR/models--org--name/refs/main`` and ``snapshots/<revision>/``). With
``HF_HUB_CACHE=DIR`` (or ``HF_HOME=H`` and ``DIR=H/hub``) and ``HF_HUB_OFFLINE=1``, ``from_pretrained("gpt2")`` then
loads the stand-in without a network. Each snapshot holds the tokenizer files and a ``config.json`` naming the model
type (``AutoTokenizer`` reads it); there are no weights.

Each stand-in keeps what the legacy code relies on (its class, special tokens, whether a BOS is prepended, the
padding side) over a character-level vocabulary: every byte (GPT-2, OPT, BLOOM: byte-level; LLaMA: SentencePiece-style
``▁`` words with byte fallback), no merges. Token ids therefore differ from the real tokenizers'; the stand-ins are
for running code offline, not for real checkpoints. An entry that already holds a different revision (a real
download) is left alone unless ``--force``.

``--datasets-cache DDIR`` also writes the hub datasets of ``DATASET_STANDINS`` (``Anthropic/hh-rlhf`` whole and with
``data_dir`` ``harmless-base`` / ``helpful-base``, ``Dahoas/rm-static``, ``yizhongw/self_instruct`` config
``super_natural_instructions``) into ``DDIR`` as the ``datasets`` library's own cache
(``DDIR/ns___name/<config id>/0.0.0/<hash>/`` with ``dataset_info.json`` and one Arrow file per split). Offline,
``datasets.load_dataset`` does not read dataset repositories from the hub cache; it falls back to that cache, so with
``HF_DATASETS_CACHE=DDIR`` (or ``HF_HOME=H``, ``DIR=H/hub``, ``DDIR=H/datasets``) and ``HF_HUB_OFFLINE=1``,
``load_dataset("Dahoas/rm-static")`` loads the stand-in. Its rows are made-up text with the columns and splits
(``train``, ``test``; 40 rows each) that the legacy dataset classes read, not the real data.
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import string
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

logger = logging.getLogger(__name__)


def _byte_level_vocab(specials: Iterable[str]) -> Dict[str, int]:
    """Special tokens first, then the 256 byte-level characters."""
    from tokenizers import pre_tokenizers

    vocab = {token: i for i, token in enumerate(specials)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(char, len(vocab))
    return vocab


def _gpt2() -> Any:
    from transformers import GPT2Tokenizer

    # GPT-2: "<|endoftext|>" is BOS, EOS and UNK; no pad token, nothing prepended, right padding.
    return GPT2Tokenizer(vocab=_byte_level_vocab(["<|endoftext|>"]), merges=[])


def _opt() -> Any:
    from transformers import GPT2Tokenizer

    # OPT: a GPT-2 tokenizer that prepends "</s>" (its BOS and EOS) to every text, with a "<pad>" token.
    return GPT2Tokenizer(vocab=_byte_level_vocab(["<pad>", "</s>", "<unk>"]), merges=[], bos_token="</s>",
                         eos_token="</s>", unk_token="</s>", pad_token="<pad>", add_bos_token=True)


def _bloom() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # BLOOM: a fast byte-level tokenizer, nothing prepended, left padding.
    backend = Tokenizer(models.BPE(vocab=_byte_level_vocab(["<unk>", "<s>", "</s>", "<pad>"]), merges=[],
                                   unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", padding_side="left")


def _llama() -> Any:
    from transformers import LlamaTokenizer

    # LLaMA: "▁"-words with byte fallback, "<s>" prepended, no pad token (scripts use "<unk>").
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in ["▁"] + list(string.ascii_letters + string.digits + string.punctuation):
        vocab.setdefault(char, len(vocab))
    return LlamaTokenizer(vocab=vocab, merges=[], add_bos_token=True)


STANDINS: Dict[str, Callable[[], Any]] = {
    "gpt2": _gpt2,
    "facebook/opt-350m": _opt,
    "bigscience/bloom-560m": _bloom,
    "hf-internal-testing/llama-tokenizer": _llama,
}
# The model type each config.json names (``AutoTokenizer`` reads the model config); no weights are written.
MODEL_TYPES = {"gpt2": "gpt2", "facebook/opt-350m": "opt", "bigscience/bloom-560m": "bloom",
               "hf-internal-testing/llama-tokenizer": "llama"}


def revision(name: str) -> str:
    """The stand-in's fixed 40-hex revision (the same on every machine)."""
    return hashlib.sha1(f"coati-relay stand-in {name}".encode()).hexdigest()


def repo_dir(cache_dir: Path, name: str) -> Path:
    return cache_dir / ("models--" + name.replace("/", "--"))


def write_standin(cache_dir: Path, name: str, force: bool = False) -> Optional[Path]:
    """Writes the stand-in of ``name`` into ``cache_dir``; returns its snapshot directory, or None when the cache
    already holds another revision of ``name`` (and not ``force``)."""
    if name not in STANDINS:
        raise ValueError(f"no stand-in for {name!r}; known: {sorted(STANDINS)}")
    repo, rev = repo_dir(cache_dir, name), revision(name)
    ref = repo / "refs" / "main"
    if ref.exists() and ref.read_text().strip() != rev and not force:
        logger.warning("%s already holds %s at revision %s (a real download?); left alone (use --force to replace)",
                       cache_dir, name, ref.read_text().strip())
        return None
    snapshot = repo / "snapshots" / rev
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        from transformers import AutoConfig

        tokenizer = STANDINS[name]()
        tokenizer.save_pretrained(tmp)
        ids = {f"{k}_token_id": getattr(tokenizer, f"{k}_token_id") for k in ("bos", "eos", "pad")}
        AutoConfig.for_model(MODEL_TYPES[name], vocab_size=len(tokenizer), **ids).save_pretrained(tmp)
        if snapshot.exists():
            shutil.rmtree(snapshot)
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tmp, snapshot)
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(rev)
    return snapshot


def write_standins(cache_dir: os.PathLike, names: Optional[Iterable[str]] = None, force: bool = False) -> List[str]:
    """Writes the stand-ins of ``names`` (default: all) into the hub cache ``cache_dir``; returns the names
    written."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    return [n for n in (names or STANDINS) if write_standin(cache, n, force) is not None]


# Stand-in dataset rows: made-up arithmetic questions, not the hub datasets' content.
def _exchanges(numbers: range) -> List[Dict[str, str]]:
    return [{"question": f"Stand-in question {i}: what is {i} plus {i + 1}?",
             "good": f"{i} plus {i + 1} is {2 * i + 1}.", "bad": "I do not know."} for i in numbers]


def _hh_rlhf(numbers: range) -> List[Dict[str, str]]:
    return [{"chosen": f"\n\nHuman: {e['question']}\n\nAssistant: {e['good']}",
             "rejected": f"\n\nHuman: {e['question']}\n\nAssistant: {e['bad']}"} for e in _exchanges(numbers)]


def _rm_static(numbers: range) -> List[Dict[str, str]]:
    return [{"prompt": f"\n\nHuman: {e['question']}\n\nAssistant:", "response": f" {e['good']}",
             "chosen": f" {e['good']}", "rejected": f" {e['bad']}"} for e in _exchanges(numbers)]


def _self_instruct(numbers: range) -> List[Dict[str, str]]:
    return [{"prompt": f"Task: Answer the arithmetic question.\nInput: {e['question']}\nOutput:",
             "completion": f" {e['good']}"} for e in _exchanges(numbers)]


# (hub name, config name, data_dir) -> the rows for a range of question numbers.
DATASET_STANDINS: Dict[Tuple[str, Optional[str], Optional[str]], Callable[[range], List[Dict[str, str]]]] = {
    ("Anthropic/hh-rlhf", None, None): _hh_rlhf,
    ("Anthropic/hh-rlhf", None, "harmless-base"): _hh_rlhf,
    ("Anthropic/hh-rlhf", None, "helpful-base"): _hh_rlhf,
    ("Dahoas/rm-static", None, None): _rm_static,
    ("yizhongw/self_instruct", "super_natural_instructions", None): _self_instruct,
}
DATASET_SPLITS = ("train", "test")
DATASET_ROWS = 40


def dataset_config_dir(cache_dir: Path, name: str, config_name: Optional[str], data_dir: Optional[str]) -> Path:
    """Where ``load_dataset(name, config_name, data_dir=data_dir)`` looks in the ``datasets`` cache offline."""
    from datasets import BuilderConfig
    from datasets.naming import camelcase_to_snakecase

    namespace, short = name.split("/")
    kwargs = {"data_dir": data_dir} if data_dir else {}
    config_id = BuilderConfig(config_name or "default").create_config_id(config_kwargs=kwargs)
    return cache_dir / f"{namespace}___{camelcase_to_snakecase(short)}" / config_id


def write_dataset_standin(cache_dir: Path, name: str, config_name: Optional[str] = None,
                          data_dir: Optional[str] = None, force: bool = False) -> Optional[Path]:
    """Writes the stand-in of ``name`` (``config_name``, ``data_dir``) into the ``datasets`` cache ``cache_dir``;
    returns its directory, or None when the cache already holds another version of it (and not ``force``)."""
    from datasets import DatasetInfo, Features, SplitDict, SplitInfo, Value
    from datasets.arrow_writer import ArrowWriter
    from datasets.naming import camelcase_to_snakecase, filenames_for_dataset_split

    key = (name, config_name, data_dir)
    if key not in DATASET_STANDINS:
        raise ValueError(f"no dataset stand-in for {key!r}; known: {list(DATASET_STANDINS)}")
    config_dir = dataset_config_dir(cache_dir, name, config_name, data_dir)
    target = config_dir / "0.0.0" / revision(f"{name} {config_dir.name}")[:16]
    others = [p for p in config_dir.glob("*/*") if p != target]
    if others and not force:
        logger.warning("%s already holds %s at %s (a real download?); left alone (use --force to replace)",
                       cache_dir, name, others[0])
        return None
    if config_dir.exists():
        shutil.rmtree(config_dir)
    target.mkdir(parents=True)
    short = camelcase_to_snakecase(name.split("/")[1])
    splits = SplitDict(dataset_name=short)
    features = None
    for i, split in enumerate(DATASET_SPLITS):
        rows = DATASET_STANDINS[key](range(i * DATASET_ROWS, (i + 1) * DATASET_ROWS))
        features = Features({column: Value("string") for column in rows[0]})
        [path] = filenames_for_dataset_split(str(target), short, split, filetype_suffix="arrow")
        with ArrowWriter(features=features, path=path) as writer:
            for row in rows:
                writer.write(row)
            count, size = writer.finalize()
        splits.add(SplitInfo(name=split, num_bytes=size, num_examples=count, dataset_name=short))
    DatasetInfo(description="coati-relay stand-in: made-up rows, not the hub dataset", features=features,
                splits=splits, config_name=config_name or "default", dataset_name=short).write_to_directory(str(target))
    return target


def write_dataset_standins(cache_dir: os.PathLike, force: bool = False) -> List[str]:
    """Writes every dataset stand-in into the ``datasets`` cache ``cache_dir``; returns the entries written."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    written = []
    for name, config_name, data_dir in DATASET_STANDINS:
        if write_dataset_standin(cache, name, config_name, data_dir, force) is not None:
            written.append(name + "".join(f" ({k})" for k in (config_name, data_dir) if k))
    return written


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coati_compat.hub_standins", description=__doc__.split("\n\n")[0])
    parser.add_argument("cache_dir", help="the hub cache to write (then run with HF_HUB_CACHE=<cache_dir>)")
    parser.add_argument("names", nargs="*", help=f"hub names (default: all of {sorted(STANDINS)})")
    parser.add_argument("--datasets-cache", metavar="DDIR",
                        help="also write the hub dataset stand-ins into this datasets cache (HF_DATASETS_CACHE)")
    parser.add_argument("--force", action="store_true", help="replace entries that hold another revision")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    written = write_standins(args.cache_dir, args.names or None, args.force)
    logger.info("wrote %s into %s; use HF_HUB_CACHE=%s HF_HUB_OFFLINE=1", ", ".join(written) or "nothing",
                args.cache_dir, os.path.abspath(args.cache_dir))
    if args.datasets_cache:
        written = write_dataset_standins(args.datasets_cache, args.force)
        logger.info("wrote %s into %s; use HF_DATASETS_CACHE=%s", ", ".join(written) or "nothing",
                    args.datasets_cache, os.path.abspath(args.datasets_cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
