"""Legacy ``coati.dataset`` (final release) against the legacy tokenisation written out here: each sample is the
tokenizer's own encoding of ``prompt + completion + eos`` padded to ``max_length``, labels ignore the prompt and the
padding; reward pairs are the encodings of ``prompt + chosen/rejected + eos``. Tokenizers: the hub stand-ins of
``coati_compat.hub_standins`` (written to a temporary hub cache), which must load by hub name offline."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from coati_compat import hub_standins
from coati_compat.legacy.datasets import HhRlhfDataset, PromptDataset, RmStaticDataset
from coati_compat.legacy.sft_datasets import IGNORE_INDEX, PROMPT_DICT, SFTDataset, SupervisedDataset

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

RECORDS = [{"prompt": "Say hi. ", "completion": "hi there", "chosen": "hi!", "rejected": "no."},
           {"prompt": "Count: ", "completion": "one two three four five six seven", "chosen": "1 2",
            "rejected": "?"}]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub")
    assert hub_standins.write_standins(cache) == list(hub_standins.STANDINS)
    return cache


def _load(name, cache):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name, cache_dir=str(cache))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.unk_token if "llama" in name else tokenizer.eos_token
    return tokenizer


def test_standins_keep_the_hub_tokenizers_conventions(hub_cache):
    text = "Hello world"
    gpt2 = _load("gpt2", hub_cache)
    assert gpt2.decode(gpt2(text)["input_ids"]) == text and gpt2.padding_side == "right"
    opt = _load("facebook/opt-350m", hub_cache)
    assert opt(text)["input_ids"][0] == opt.eos_token_id == opt.bos_token_id  # OPT prepends </s>
    llama = _load("hf-internal-testing/llama-tokenizer", hub_cache)
    assert llama(text)["input_ids"][0] == llama.bos_token_id and llama.unk_token == "<unk>"
    bloom = _load("bigscience/bloom-560m", hub_cache)
    assert bloom.padding_side == "left" and bloom.bos_token_id not in bloom(text)["input_ids"]
    assert hub_standins.write_standin(hub_cache, "gpt2") is not None  # rewriting its own revision is allowed
    (hub_standins.repo_dir(hub_cache, "gpt2") / "refs" / "main").write_text("0" * 40)  # as if really downloaded
    assert hub_standins.write_standin(hub_cache, "gpt2") is None
    hub_standins.write_standin(hub_cache, "gpt2", force=True)


def _expected_sft(tokenizer, prompt, completion, max_length):
    enc = tokenizer(prompt + completion + tokenizer.eos_token, max_length=max_length, padding="max_length",
                    truncation=True, return_tensors="pt")
    ids, mask = enc["input_ids"][0], enc["attention_mask"][0]
    prompt_len = len(tokenizer(prompt, max_length=max_length, truncation=True)["input_ids"])
    real = int(mask.sum())
    start = 0 if tokenizer.padding_side == "right" else max_length - real  # where the sample's tokens begin
    labels = ids.clone()
    labels[:start + prompt_len] = IGNORE_INDEX
    labels[start + real:] = IGNORE_INDEX
    return ids, labels, mask


@pytest.mark.parametrize("name", list(hub_standins.STANDINS))
@pytest.mark.parametrize("max_length", [24, 64])
def test_sft_dataset_is_the_legacy_tokenisation(hub_cache, name, max_length):
    tokenizer = _load(name, hub_cache)
    dataset = SFTDataset(RECORDS, tokenizer, max_length)
    assert len(dataset) == 2
    for i, record in enumerate(RECORDS):
        ids, labels, mask = _expected_sft(tokenizer, record["prompt"], record["completion"], max_length)
        sample = dataset[i]
        assert list(sample) == ["input_ids", "labels", "attention_mask"]
        assert torch.equal(sample["input_ids"], ids) and torch.equal(sample["attention_mask"], mask)
        assert torch.equal(sample["labels"], labels)


def test_a_full_length_right_padded_sample_keeps_its_completion_labels(hub_cache):
    """The legacy code masked every label of a right-padded sample that filled ``max_length`` (its ``[-0:]``
    slice); here the completion keeps its labels (migration_guide/deviations.md)."""
    tokenizer = _load("gpt2", hub_cache)
    sample = SFTDataset(RECORDS[1:], tokenizer, max_length=16)[0]
    assert int(sample["attention_mask"].sum()) == 16
    kept = sample["labels"] != IGNORE_INDEX
    assert kept.any() and torch.equal(sample["labels"][kept], sample["input_ids"][kept])


def test_supervised_dataset_formats_alpaca_records(hub_cache, tmp_path):
    tokenizer = _load("gpt2", hub_cache)
    records = [{"instruction": "Add.", "input": "1 and 2", "output": "3"}, {"instruction": "Greet.", "output": "hi"},
               {"instruction": "Skip.", "output": "x"}]
    path = tmp_path / "sft.json"
    path.write_text(json.dumps(records))
    dataset = SupervisedDataset(str(path), tokenizer, max_datasets_size=2, max_length=128)
    assert len(dataset) == 2
    sources = [PROMPT_DICT["prompt_input"].format_map(records[0]),
               PROMPT_DICT["prompt_no_input"].format_map(records[1])]
    for i in range(2):
        ids, labels, _ = _expected_sft(tokenizer, sources[i], records[i]["output"], 128)
        assert torch.equal(dataset[i]["input_ids"], ids) and torch.equal(dataset[i]["labels"], labels)


@pytest.mark.parametrize("cls,prefix", [(RmStaticDataset, True), (HhRlhfDataset, False)])
def test_reward_pairs_are_the_tokenised_texts(hub_cache, cls, prefix):
    tokenizer = _load("facebook/opt-350m", hub_cache)
    dataset = cls(RECORDS, tokenizer, 32)
    for i, record in enumerate(RECORDS):
        head = record["prompt"] if prefix else ""
        for offset, field in ((0, "chosen"), (2, "rejected")):
            enc = tokenizer(head + record[field] + tokenizer.eos_token, max_length=32, padding="max_length",
                            truncation=True, return_tensors="pt")
            assert torch.equal(dataset[i][offset], enc["input_ids"][0])
            assert torch.equal(dataset[i][offset + 1], enc["attention_mask"][0])
    assert torch.equal(cls(RECORDS, tokenizer, 32, special_token="!")[0][0],
                       tokenizer(RECORDS[0]["prompt" if prefix else "chosen"] + ("hi!" if prefix else "") + "!",
                                 max_length=32, padding="max_length", return_tensors="pt")["input_ids"][0])


def test_prompt_dataset_tokenises_instructions(hub_cache, tmp_path):
    tokenizer = _load("hf-internal-testing/llama-tokenizer", hub_cache)
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([{"instruction": "Tell me a joke."}, {"instruction": "Why?"}, {"instruction": "x"}]))
    dataset = PromptDataset(str(path), tokenizer, max_datasets_size=2, max_length=12)
    assert len(dataset) == 2 and list(dataset[0]) == ["input_ids", "attention_mask"]
    enc = tokenizer("Why?", max_length=12, padding="max_length", truncation=True, return_tensors="pt")
    assert torch.equal(dataset[1]["input_ids"], enc["input_ids"][0])


class _GlmLike:
    """A ChatGLM-6B-shaped tokenizer: one id per character, ``prompt [gMASK] <bos> answer <eos>``."""

    gmask_token_id, bos_token_id, eos_token_id, pad_token_id, eos_token = 5, 6, 7, 0, "</s>"

    def encode(self, text, add_special_tokens=False):
        return [100 + ord(c) % 50 for c in text.replace("</s>", "")]

    def build_inputs_with_special_tokens(self, prompt, answer):
        return prompt + [self.gmask_token_id, self.bos_token_id] + answer + [self.eos_token_id]


@pytest.mark.parametrize("prompt,answer,max_length", [("abc", "de", 12), ("abcdef", "gh", 8), ("abcdef", "ghijk", 6)])
def test_chatglm_layout_keeps_the_markers_and_length(prompt, answer, max_length):
    glm = _GlmLike()
    sample = SFTDataset([{"prompt": prompt, "completion": answer}], glm, max_length)[0]
    assert list(sample) == ["input_ids", "labels"]
    ids, labels = sample["input_ids"].tolist(), sample["labels"].tolist()
    full = glm.build_inputs_with_special_tokens(glm.encode(prompt), glm.encode(answer))
    assert len(ids) == len(labels) == max_length
    kept = [t for t in ids if t != glm.pad_token_id]
    excess = max(0, len(full) - max_length)
    if excess <= len(prompt):  # the prompt's first tokens go
        assert kept == full[excess:]
    else:  # the whole prompt and the answer's first tokens go; [gMASK] <bos> stay in front
        assert kept == [glm.gmask_token_id, glm.bos_token_id] + full[excess + 2:]
    assert kept[-1] == glm.eos_token_id
    bos = ids.index(glm.bos_token_id)
    assert labels[:bos] == [IGNORE_INDEX] * bos and labels[bos:len(kept)] == kept[bos:]


def test_bad_records_and_tokenizers_say_what_is_wrong(hub_cache):
    tokenizer = _load("gpt2", hub_cache)
    with pytest.raises(ValueError, match="completion"):
        SFTDataset([{"prompt": "x"}], tokenizer, 16)
    with pytest.raises(ValueError, match="needs the fields"):
        RmStaticDataset([{"chosen": "a", "rejected": "b"}], tokenizer, 16)
    with pytest.raises(ValueError, match="eos_token"):
        HhRlhfDataset(RECORDS, SimpleNamespace(eos_token=None), 16)
    with pytest.raises(ValueError, match="max_length"):
        SFTDataset(RECORDS, tokenizer, 0)
