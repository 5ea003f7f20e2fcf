"""coati_relay.rewards: rule-based rewards on crafted strings, the registry, and the reward-model scorer."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from coati_relay import rewards
from coati_relay.rewards import math_rewards

T = torch.tensor


# -------------------------------------------------------------------------------------------------- boxed
@pytest.mark.parametrize("response,gt,expected", [
    ("so the answer is \\boxed{42}.", "42", 10.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 10.0),                     # nested braces
    ("first \\boxed{1}, then \\boxed{ 2 }", "2", 10.0),         # the last box counts
    ("first \\boxed{2}, then \\boxed{1}", "2", 0.0),
    ("$\\boxed{3.50}$", "3.5", 10.0),
    ("\\boxed{1,000}", "1000", 10.0),
    ("\\boxed{\\text{Yes}}", "yes", 10.0),
    ("\\boxed{42}", "\\boxed{42}", 10.0),                       # a boxed ground truth is unwrapped
    ("\\boxed{42}", 42, 10.0),                                  # non-str ground truth
    ("the answer is 42", "42", 0.0),                            # no box: invalid format
    ("\\boxed{42", "42", 0.0),                                  # unclosed box
    ("\\boxed{42}", None, 0.0),                                 # no ground truth
    ("\\boxed{0.5}", "1/2", 10.0),                              # math_verify: equal values
    ("\\boxed {42}", "42", 0.0),                                # only "\\boxed{" is looked up
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", 0.0),                 # ColossalChat's extraction settings
])
def test_boxed(response, gt, expected):
    assert rewards.get_reward_fn("boxed")([response], [gt], ["q"]).tolist() == [expected]


def test_extract():
    assert rewards.extract_boxed("a \\boxed{x^{2}+\\frac{1}{2}} b") == "x^{2}+\\frac{1}{2}"
    assert rewards.extract_boxed("no box") is None
    assert rewards.extract_boxed("\\boxed{1} then \\boxed{2") is None  # the last one counts, and it is unclosed
    assert rewards.grade_boxed("\\boxed{7}", "8") == rewards.MathGrade(True, False, 0.0)


# -------------------------------------------------------------------------------------------------- think/answer
GOOD = "<think>6 times 7</think><answer>42</answer>"


@pytest.mark.parametrize("response,expected", [
    (GOOD, 10.0),
    (GOOD + "\n ", 0.0),                                                   # nothing after </answer>
    ("<think>hm</think><answer> $42$ </answer>", 10.0),
    ("<think>6 times 7</think><answer>41</answer>", 0.0),                  # format only
    ("<answer>42</answer>", 0.0),                                          # missing think
    ("<think>a</think><think>b</think><answer>42</answer>", 0.0),          # tag twice
    ("<answer>42</answer><think>x</think>", 0.0),                          # out of order
    (GOOD + " thanks", 0.0),                                               # text after </answer>
    ("<think>x</think><answer>42", 0.0),
])
def test_think_answer_tags(response, expected):
    assert rewards.get_reward_fn("think_answer_tags")([response], ["42"], ["q"]).tolist() == [expected]


def test_think_answer_grades():
    assert rewards.grade_think_answer(GOOD, "42") == rewards.MathGrade(True, True, 10.0)
    assert rewards.grade_think_answer(GOOD, "41") == rewards.MathGrade(True, False, 0.0)
    assert rewards.grade_think_answer("42", "42") == rewards.MathGrade(False, False, 0.0)
    assert rewards.extract_answer_tag("<answer>1</answer><answer> 2 </answer>") == "2"


def test_math_verify_path(monkeypatch):
    """math_verify decides first; a text match (spaces, braces, commas dropped) rescues the rest: 5 when the
    prediction does not parse, else 10."""
    fake = SimpleNamespace(  # a side written as "{..}" does not parse ("\\boxed{{..}}")
        parse=lambda s, **kw: [] if "{{" in s else [s.replace(" ", "")],
        verify=lambda gold, pred, **kw: gold == pred or (gold == ["\\boxed{1/2}"] and pred == ["\\boxed{0.5}"]),
    )
    monkeypatch.setattr(math_rewards, "_checker", lambda: (fake, ()))
    assert rewards.score_answer("0.5", "1/2") == 10.0
    assert rewards.score_answer("0.7", "1/2") == 0.0
    assert rewards.score_answer("{a}", "a") == 5.0  # the prediction does not parse, the text matches
    assert rewards.score_answer("{a}", "b") == 0.0
    assert rewards.score_answer("a", "{a}") == 10.0  # the gold does not parse, the text matches
    assert rewards.score_answer("a,b", "a b") == 10.0  # parsed and unequal, the text matches


def test_math_verify_is_required(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    math_rewards._checker.cache_clear()
    try:
        with pytest.raises(ImportError, match="math-verify==0.9.0"):
            rewards.score_answer("1", "1")
    finally:
        math_rewards._checker.cache_clear()


def test_math_verify_off_the_main_thread():
    """Scoring from a worker thread gives the main thread's answer (math_verify's SIGALRM bound is left off)."""
    import threading

    out = []
    worker = threading.Thread(target=lambda: out.append(rewards.score_answer("\\frac{1}{2}", "0.5")))
    worker.start()
    worker.join()
    assert out == [10.0]


def test_soft_overlength_penalty():
    # L = 10, c = 4: lengths 5 and 6 untouched, 8 -> 1 + (6 - 8) / 4 * 10 = -4, 10 and 12 -> 0
    r = T([1.0, 1.0, 1.0, 1.0, 1.0])
    out = rewards.soft_overlength_penalty(r, T([5, 6, 8, 10, 12]), max_new_tokens=10, cache_length=4)
    assert out.tolist() == [1.0, 1.0, -4.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="cache_length"):
        rewards.soft_overlength_penalty(r, T([1, 2, 3, 4, 5]), max_new_tokens=4, cache_length=8)


# -------------------------------------------------------------------------------------------------- toy task
def test_toy_letter():
    fn = rewards.get_reward_fn("toy_letter")
    out = fn(["aaab", "a a a", "", "   ", "bcd", "eeA"], ["a", "a", "a", "a", None, "e"], None)
    torch.testing.assert_close(out, T([0.75, 1.0, 0.0, 0.0, 0.0, 2 / 3]))
    assert out.dtype == torch.float32
    assert fn(["aab"], None).tolist() == pytest.approx([2 / 3])  # gt None -> "a"
    with pytest.raises(ValueError, match="single character"):
        fn(["a"], ["ab"])


# -------------------------------------------------------------------------------------------------- registry
def test_reward_registry_and_errors():
    assert {"boxed", "think_answer_tags", "toy_letter"} <= set(rewards.reward_names())
    with pytest.raises(ValueError, match=r"unknown reward 'nope'.*'boxed'"):
        rewards.get_reward_fn("nope")
    with pytest.raises(TypeError, match="reward name or a callable"):
        rewards.get_reward_fn(3)
    with pytest.raises(ValueError, match="already registered"):
        rewards.register_reward("boxed")(lambda r, g, p: [0.0] * len(r))


def test_user_callable_is_checked():
    fn = rewards.get_reward_fn(lambda responses, gts, prompts: [len(r) for r in responses])
    out = fn(["ab", "abc"], [None, None], ["p", "q"])
    assert out.dtype == torch.float32 and out.tolist() == [2.0, 3.0]
    as_column = rewards.get_reward_fn(lambda r, g, p: torch.ones(len(r), 1, dtype=torch.float64))
    assert as_column(["x", "y"]).shape == (2,)
    with pytest.raises(ValueError, match=r"shape \(1,\) for 2 responses"):
        rewards.get_reward_fn(lambda r, g, p: [1.0])(["a", "b"])
    with pytest.raises(TypeError, match="must return a Tensor"):
        rewards.get_reward_fn(lambda r, g, p: "good")(["a"])
    with pytest.raises(ValueError, match="gt_answers has 1 entries for 2 responses"):
        fn(["a", "b"], ["x"])
    with pytest.raises(TypeError, match="list of str"):
        fn([1, 2])


# -------------------------------------------------------------------------------------------------- reward model
@pytest.fixture(scope="module")
def rm_scorer(tiny_model_path):
    return rewards.RewardModelScorer.from_causal_lm(tiny_model_path, seed=0)


def test_reward_model_scores_last_real_token(rm_scorer):
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(10, 300, (3, 7), generator=g)
    full = torch.ones(3, 7, dtype=torch.long)
    scores = rm_scorer(seq, full)
    assert scores.shape == (3,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    # HF's own pooled logits agree when no pad token is in the sequences
    pooled = rm_scorer.model(input_ids=seq, attention_mask=full).logits.squeeze(-1)
    torch.testing.assert_close(scores, pooled)
    # Right padding after the last real token does not change a row's score; the score is read at that token
    pad = rm_scorer.model.config.pad_token_id
    padded = torch.cat([seq, torch.full((3, 3), pad)], dim=1)
    mask = torch.cat([full, torch.zeros(3, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(rm_scorer(padded, mask), scores, rtol=1e-5, atol=1e-5)
    shorter = rm_scorer(seq[:1, :5], full[:1, :5])
    mask[0, 5:] = 0
    assert rm_scorer(padded, mask)[0].item() == pytest.approx(shorter.item(), abs=1e-5)


def test_reward_model_is_seeded_and_scores_texts(tiny_model_path, rm_scorer):
    again = rewards.RewardModelScorer.from_causal_lm(tiny_model_path, seed=0)
    other = rewards.RewardModelScorer.from_causal_lm(tiny_model_path, seed=1)
    assert torch.equal(again.model.score.weight, rm_scorer.model.score.weight)
    assert not torch.equal(other.model.score.weight, rm_scorer.model.score.weight)
    texts = rm_scorer.score_texts(["hello there", "a"])
    assert texts.shape == (2,)
    fn = rewards.get_reward_fn(rm_scorer.as_reward_fn())
    torch.testing.assert_close(fn(["there", "a"], None, ["hello ", ""]), texts)


def test_reward_model_accepts_modules_and_rejects_bad_inputs():
    class PerToken(nn.Module):
        def forward(self, input_ids, attention_mask):
            return input_ids.float()  # [N,S]: score = the last real token id

    scorer = rewards.RewardModelScorer(PerToken())
    out = scorer(T([[5, 6, 0], [7, 0, 0]]), T([[1, 1, 0], [1, 0, 0]]))
    assert out.tolist() == [6.0, 7.0]
    with pytest.raises(ValueError, match="no token with attention_mask"):
        scorer(T([[5, 6]]), T([[0, 0]]))
    with pytest.raises(ValueError, match="one shape"):
        scorer(T([[5, 6]]), T([[1]]))
    with pytest.raises(ValueError, match="no config.json"):
        rewards.RewardModelScorer("/nonexistent/rm")
    with pytest.raises(TypeError, match="checkpoint path or an nn.Module"):
        rewards.RewardModelScorer(42)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        scorer.score_texts(["a"])


def test_a_reward_that_raises_or_returns_nan_names_itself_and_the_response():
    from coati_relay.rewards import get_reward_fn

    def flaky(responses, gt_answers, prompts):
        raise KeyError("answer")

    with pytest.raises(KeyError) as err:
        get_reward_fn(flaky)(["ok", "no"])
    if sys.version_info >= (3, 11):  # exception notes (PEP 678)
        assert any("reward function" in n and "flaky on a batch of 2 responses (the first: 'ok')" in n
                   for n in err.value.__notes__)

    def nan_on_second(responses, gt_answers, prompts):
        return [1.0, float("nan"), float("inf")]

    with pytest.raises(ValueError, match=r"returned nan for response 1 of 3 \('b'\) and 1 more; rewards must be "
                                         r"finite"):
        get_reward_fn(nan_on_second)(["a", "b", "c"])
