"""Prompt loading (jsonl, csv, lists; chat template; truncation; every error) and the task sampler."""
from __future__ import annotations

import json

import pytest

from coati_relay.prompts import PromptSampler, load_prompts
from coati_relay.rewards.system_prompts import DEFAULT_SYSTEM_PROMPT
from coati_relay.toy import toy_prompt_text, write_toy_dataset


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def _write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


# ---------------------------------------------------------------- formats


def test_jsonl_single_message_gets_chat_template_with_the_default_system_prompt(tokenizer, tmp_path):
    # ColossalChat: [system, message] through the chat template, system_prompt None -> its default prompt
    path = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=6, letters="ae")
    ds = load_prompts(path, tokenizer, max_prompt_tokens=4096)
    assert len(ds) == 6
    text = _decode(tokenizer, ds.prompt_ids[0])
    letter = ds.info["gt_answer"][0]
    assert text == f"<|system|>{DEFAULT_SYSTEM_PROMPT}<|end|><|user|>{toy_prompt_text(letter)}<|end|><|assistant|>"
    assert ds.info["prompt_text"][0] == text
    assert set(ds.info["gt_answer"]) <= {"a", "e"}
    messages = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                {"role": "user", "content": toy_prompt_text(letter)}]
    assert ds.prompt_ids[0] == tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]


def test_jsonl_explicit_system_prompt_replaces_the_default(tokenizer, tmp_path):
    path = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=2, letters="a")
    ds = load_prompts(path, tokenizer, system_prompt="be brief")
    assert _decode(tokenizer, ds.prompt_ids[0]) == (
        f"<|system|>be brief<|end|><|user|>{toy_prompt_text('a')}<|end|><|assistant|>")
    empty = load_prompts(path, tokenizer, system_prompt="")  # an empty system message, as in ColossalChat
    assert _decode(tokenizer, empty.prompt_ids[0]).startswith("<|system|><|end|><|user|>")


def test_jsonl_message_list_and_system_prompt(tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                      {"role": "user", "content": "again"}], "gt_answer": "x"},
        {"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "q"}],
         "test_cases": {"inputs": ["1"], "outputs": ["2"]}},
    ])
    ds = load_prompts(path, tokenizer, system_prompt="be brief")
    assert _decode(tokenizer, ds.prompt_ids[0]) == (
        "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>yo<|end|><|user|>again<|end|><|assistant|>")
    # A conversation that brings its own system message keeps it.
    assert _decode(tokenizer, ds.prompt_ids[1]) == "<|system|>own<|end|><|user|>q<|end|><|assistant|>"
    assert ds.info["gt_answer"] == ["x", None]
    assert ds.info["test_cases"] == [None, {"inputs": ["1"], "outputs": ["2"]}]


def test_truncation_keeps_the_first_max_length_tokens(tokenizer, tmp_path, caplog):
    # ColossalChat keeps the first max_length tokens: an over-long prompt loses its end (generation prompt included)
    long = " ".join(["hello world"] * 50)
    ds = load_prompts([{"messages": {"role": "user", "content": long}}, {"messages": {"role": "user", "content": "a"}}],
                      tokenizer, max_prompt_tokens=8)
    assert len(ds.prompt_ids[0]) == 8
    full = tokenizer(ds.info["prompt_text"][0], add_special_tokens=False)["input_ids"]
    assert ds.prompt_ids[0] == full[:8]
    assert ds.prompt_ids[0][-1] != tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert len(ds.prompt_ids[1]) < 8
    assert "1 of 2 prompts exceed max_length=8" in caplog.text and "kept their first 8 tokens" in caplog.text
    # the default system prompt of a .jsonl path comes first, so a short max_length keeps only its start
    path = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=2, letters="a")
    cut = load_prompts(path, tokenizer, max_prompt_tokens=16)
    assert _decode(tokenizer, cut.prompt_ids[0]) == _decode(tokenizer, cut.prompt_ids[1])
    assert _decode(tokenizer, cut.prompt_ids[0]).startswith("<|system|>You are")


def test_csv_is_raw_text_unless_asked(tokenizer, tmp_path):
    path = write_toy_dataset(tmp_path / "p.csv", num_prompts=4, letters="o", fmt="csv")
    raw = load_prompts(path, tokenizer)
    assert raw.prompt_ids[0] == tokenizer(toy_prompt_text("o"))["input_ids"]
    assert raw.info["gt_answer"] == ["o"] * 4
    chat = load_prompts(path, tokenizer, chat_template=True, system_prompt="s")
    expected = f"<|system|>s<|end|><|user|>{toy_prompt_text('o')}<|end|><|assistant|>"
    assert _decode(tokenizer, chat.prompt_ids[0]) == expected


def test_lists_of_strings_and_dicts(tokenizer):
    ds = load_prompts(["abc", "de f"], tokenizer)
    assert ds.prompt_ids == [tokenizer("abc")["input_ids"], tokenizer("de f")["input_ids"]]
    assert ds.info == {"prompt_text": ["abc", "de f"]}
    ds = load_prompts([{"messages": {"role": "user", "content": "abc"}, "gt_answer": 3}], tokenizer)
    assert _decode(tokenizer, ds.prompt_ids[0]) == "<|user|>abc<|end|><|assistant|>"
    assert ds.info["gt_answer"] == [3]
    templated = load_prompts(["abc"], tokenizer, chat_template=True)
    assert templated.prompt_ids == ds.prompt_ids


# ---------------------------------------------------------------- errors


def test_missing_file(tokenizer, tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompts(path, tokenizer)


@pytest.mark.parametrize("name,content", [("e.jsonl", ""), ("e.jsonl", "\n  \n"), ("e.csv", ""),
                                          ("e.csv", "prompt,gt_answer\n")])
def test_empty_file(tokenizer, tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=f"{path}.*no prompts"):
        load_prompts(path, tokenizer)


def test_malformed_json_line_names_the_line(tokenizer, tmp_path):
    ok = {"messages": {"role": "user", "content": "x"}}
    path = _write_jsonl(tmp_path / "bad.jsonl", [ok, "", '{"messages": {"role": "user", "content": "x"}'])
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not valid JSON"):
        load_prompts(path, tokenizer)


@pytest.mark.parametrize("record,match", [
    ({"prompt": "x"}, "no 'messages' field"),
    ({"messages": []}, "non-empty list"),
    ({"messages": {"role": "user"}}, "'role' and 'content'"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_records_name_the_line(tokenizer, tmp_path, record, match):
    path = _write_jsonl(tmp_path / "r.jsonl", [{"messages": {"role": "user", "content": "x"}}, record])
    with pytest.raises(ValueError, match=rf"r\.jsonl:2: .*{match}"):
        load_prompts(path, tokenizer)


def test_bad_dict_in_list_names_its_index(tokenizer):
    with pytest.raises(ValueError, match=r"prompts\[1\]: no 'messages'"):
        load_prompts([{"messages": {"role": "user", "content": "x"}}, {"content": "y"}], tokenizer)


def test_csv_without_prompt_column(tokenizer, tmp_path):
    path = tmp_path / "q.csv"
    path.write_text("question,gt_answer\nwhat,1\n")
    with pytest.raises(ValueError, match=r"q\.csv: no 'prompt' column.*question"):
        load_prompts(path, tokenizer)


def test_csv_row_with_extra_fields(tokenizer, tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("prompt\nok\na,b\n")
    with pytest.raises(ValueError, match=r"x\.csv:3: more fields"):
        load_prompts(path, tokenizer)


def test_unknown_extension(tokenizer, tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("hello\n")
    with pytest.raises(ValueError, match=r"p\.txt: unknown extension '\.txt'.*\.jsonl.*\.csv"):
        load_prompts(path, tokenizer)


def test_tokenizer_without_chat_template(tiny_model_path, tmp_path):
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(tiny_model_path)
    bare.chat_template = None
    path = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=2)
    with pytest.raises(ValueError, match=r"p\.jsonl: tokenizer .* has no chat template.*chat_template"):
        load_prompts(path, bare)
    csv_path = write_toy_dataset(tmp_path / "p.csv", num_prompts=2, fmt="csv")
    assert len(load_prompts(csv_path, bare)) == 2  # raw text needs no template
    with pytest.raises(ValueError, match="no chat template"):
        load_prompts(csv_path, bare, chat_template=True)


def test_empty_prompt_is_reported_with_its_line(tokenizer, tmp_path):
    path = tmp_path / "z.csv"
    path.write_text('prompt\nfine\n""\n')
    with pytest.raises(ValueError, match=r"z\.csv:3: the prompt tokenises to 0 tokens"):
        load_prompts(path, tokenizer)


def test_argument_errors(tokenizer):
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        load_prompts(["a"], tokenizer, max_prompt_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        load_prompts([], tokenizer)
    with pytest.raises(TypeError, match="only strings"):
        load_prompts(["a", {"messages": {"role": "user", "content": "b"}}], tokenizer)
    with pytest.raises(ValueError, match="chat_template=True"):
        load_prompts([{"messages": {"role": "user", "content": "b"}}], tokenizer, chat_template=False)
    with pytest.raises(ValueError, match="system_prompt needs the chat template"):
        load_prompts(["a"], tokenizer, system_prompt="s")


# ---------------------------------------------------------------- sampler


def test_sampler_epochs_are_permutations():
    s = PromptSampler(10, 3, seed=1)
    assert s.tasks_per_epoch == 3
    epoch0 = [i for t in range(3) for i in s.batch(t)]
    epoch1 = [i for t in range(3, 6) for i in s.batch(t)]
    assert len(set(epoch0)) == 9 and len(set(epoch1)) == 9  # drop_last: one prompt left out per epoch
    assert epoch0 != epoch1


def test_sampler_is_a_pure_function_of_seed_and_task():
    a, b = PromptSampler(20, 4, seed=7), PromptSampler(20, 4, seed=7)
    order = [9, 0, 3, 12, 1]
    assert {t: a.batch(t) for t in order} == {t: b.batch(t) for t in sorted(order)}
    assert [a.batch(t) for t in range(5)] != [PromptSampler(20, 4, seed=8).batch(t) for t in range(5)]


def test_sampler_no_shuffle_and_keep_last():
    s = PromptSampler(7, 3, shuffle=False, drop_last=False)
    assert s.tasks_per_epoch == 3
    assert [s.batch(t) for t in range(4)] == [[0, 1, 2], [3, 4, 5], [6], [0, 1, 2]]


def test_sampler_errors():
    with pytest.raises(ValueError, match="batch_size=5 is larger than the 4 prompts"):
        PromptSampler(4, 5)
    with pytest.raises(ValueError, match="positive int"):
        PromptSampler(0, 1)
    with pytest.raises(ValueError, match="task_index"):
        PromptSampler(4, 2).batch(-1)


def test_prompts_reach_the_model_left_padded(tokenizer, tiny_model_path, tmp_path):
    # ColossalChat left-pads prompts for generation; the pad columns are masked, so a prompt's greedy response is
    # the one it gets alone
    import torch

    from coati_relay.config.schema import SamplingConfig
    from coati_relay.inference import TransformersBackend

    ds = load_prompts(["a", "write the letter b many times:"], tokenizer, max_prompt_tokens=32)
    backend = TransformersBackend(tiny_model_path, SamplingConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True))
    both = backend.generate(ds.prompt_ids, 1)
    short = len(ds.prompt_ids[0])
    width = both.prompt_ids.size(1)
    assert width == len(ds.prompt_ids[1]) > short
    assert both.prompt_mask[0].tolist() == [0] * (width - short) + [1] * short
    assert both.prompt_ids[0, width - short:].tolist() == ds.prompt_ids[0]
    assert (both.prompt_ids[0, :width - short] == backend.pad_token_id).all()
    alone = backend.generate(ds.prompt_ids[:1], 1)
    assert torch.equal(both.response_ids[0], alone.response_ids[0])
