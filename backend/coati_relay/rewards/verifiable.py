"""ColossalChat's rule rewards, ``grpo_config['reward_fn_type']`` = ``think_answer_tags``, ``boxed`` or ``code``,
scored as its producer scores them (4f9953be3: ``coati/distributed/reward/reward_fn.py``, ``verifiable_reward.py``).

Each response gets three numbers: ``reward``, ``format_acc`` (1 when its format is valid) and ``ans_acc`` (1 when its
answer is correct; ``filter_range`` compares a group's mean of it). With L = ``grpo_config['max_new_tokens']`` and
c = ``cache_length``:

- think_answer_tags: the format is `structure_valid` under ``response_format_tags``; the answer is the last
  ``<answer>...</answer>``. boxed: the format is a closed ``\\boxed{}`` (and each tag's count, when tags are given);
  the answer is its content. A correct answer in a valid format earns 10 (5 for an exact match ``math_verify``
  cannot parse; `coati_relay.rewards.math_rewards.score_answer`).
- code: the format is a ```` ```python ```` block; the program (the last block) and the prompt's ``test_cases``
  (``{"inputs": [...], "outputs": [...]}``) are posted to ``code_verifier_api_url`` as ``{"in_outs", "generation",
  "timeout": 10, "debug": false}``; the service answers ``{"result": [1 per passed case, ...], "metadata": [...]}``.
  Every case passed (an empty list too) with a metadata record: ``ans_acc`` 1, and 10 more reward in a valid
  format. Test cases that are not JSON score 0. The engine raises where ColossalChat scores 0 without a word: no
  test_cases at all, or a verifier that cannot be reached.
- Length rules, on response tokens (EOS included): with ``soft_over_length_punishment``, a response with an answer
  (math) or passing every case (code) gets ``((L - c) - len) / c * 10`` added when ``L - c < len < L``; a response
  with ``len >= L`` gets reward 0 whatever it said (with or without the soft punishment).
"""
from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import torch

from coati_relay.rewards.math_rewards import extract_answer_tag, extract_boxed, score_answer

log = logging.getLogger(__name__)

RULE_REWARDS = ("think_answer_tags", "boxed", "code")


def target_column(kind: Optional[str]) -> str:
    """The prompt field the rule reward ``kind`` grades a response against: ``test_cases`` for the code reward, else
    ``gt_answer``."""
    return "test_cases" if kind == "code" else "gt_answer"
ACC_SCORE = 10.0
CODE_TEST_TIMEOUT_S = 10  # what ColossalChat sends the verifier for each program
THINK_ANSWER_TAGS = {"think_start": {"text": "<think>", "num_occur": 1},
                     "think_end": {"text": "</think>", "num_occur": 1},
                     "answer_start": {"text": "<answer>", "num_occur": 1},
                     "answer_end": {"text": "</answer>", "num_occur": 1}}
STRUCTURE_TAG_NAMES = tuple(THINK_ANSWER_TAGS)


def structure_valid(text: str, tags: Optional[Mapping[str, Mapping[str, Any]]] = None) -> bool:
    """think_answer_tags' format: each tag occurs ``num_occur`` times, the first occurrences of think_start,
    think_end, answer_start, answer_end are in that order, and the text ends with answer_end's first occurrence."""
    tags = THINK_ANSWER_TAGS if tags is None else tags
    counts_ok = all(text.count(t["text"]) == t["num_occur"] for t in tags.values())
    pos = {name: text.find(tags[name]["text"]) for name in STRUCTURE_TAG_NAMES}
    ordered = pos["think_start"] <= pos["think_end"] <= pos["answer_start"] <= pos["answer_end"]
    ends = len(text) - pos["answer_end"] == len(tags["answer_end"]["text"])
    return counts_ok and ordered and ends


def _tag_counts_valid(text: str, tags: Optional[Mapping[str, Mapping[str, Any]]]) -> bool:
    return not tags or all(text.count(t["text"]) == t["num_occur"] for t in tags.values())


def grade_math(kind: str, text: str, gt_answer: Any,
               tags: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Tuple[Optional[str], bool, float]:
    """(answer or None, format valid, answer score: 10, 5 or 0 whatever the format) of a math response."""
    if gt_answer is None:
        raise ValueError(f"reward_fn_type={kind!r} needs a gt_answer for every prompt; add a 'gt_answer' field to "
                         f"each line of the dataset")
    if kind == "think_answer_tags":
        answer, format_ok = extract_answer_tag(text), structure_valid(text, tags)
    else:
        answer = extract_boxed(text)
        format_ok = answer is not None and _tag_counts_valid(text, tags)
    return answer, format_ok, (score_answer(answer, gt_answer) if answer is not None else 0.0)


def extract_program(text: str) -> str:
    """The program of a code response: what follows the last ```` ```python ```` up to the next ```` ``` ```` (the
    text before any ```` ``` ```` without such a block; it is still run, but a valid format needs the block)."""
    return text.split("```python")[-1].split("```")[0]


def post_to_verifier(url: str, test_cases: Mapping[str, Any], program: str,
                     timeout_s: float = CODE_TEST_TIMEOUT_S) -> Tuple[List[Any], Any]:
    """(per-case results, metadata) the verifier answers for ``program`` (a result of 1: passed; metadata: a list
    with one record). An HTTP error status counts as every case failed, with metadata ``{}`` (as in ColossalChat);
    an unreachable service raises, naming the URL."""
    body = json.dumps({"in_outs": test_cases, "generation": program, "timeout": CODE_TEST_TIMEOUT_S,
                       "debug": False}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s * max(1, len(test_cases.get("inputs", []))) + 60) as r:
            answer = json.loads(r.read().decode())
            return list(answer["result"]), answer.get("metadata", [])
    except urllib.error.HTTPError as exc:
        log.warning("code verifier %s answered %s; the program counts as failing every case", url, exc.code)
        return [-1] * len(test_cases.get("inputs", [])), {}
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"grpo_config['code_verifier_api_url'] = {url!r} cannot be reached ({exc}); start the "
                           f"code verifier service there or point the key at it") from exc


@dataclass(frozen=True)
class CodeGrade:
    """A code response judged: its program, format, the test cases as sent, the verifier's answer, and whether
    every case passed (an empty list passes; metadata must hold a record)."""

    program: str
    format_ok: bool
    test_cases: Any
    results: List[Any]
    metadata: Any
    passed: bool


def grade_code(text: str, test_cases: Any, url: Optional[str]) -> CodeGrade:
    """Posts the program of ``text`` with ``test_cases`` (a dict, or its JSON text) to the verifier at ``url``.
    Test cases that are not JSON fail without a post (logged); missing ones (None) raise."""
    program, format_ok = extract_program(text), "```python" in text
    if test_cases is None:
        raise ValueError("reward_fn_type='code' needs test_cases for every prompt; add a 'test_cases' field "
                         "({'inputs': [...], 'outputs': [...]}) to each line of the dataset")
    cases = test_cases
    if not isinstance(cases, dict):
        try:
            cases = json.loads(cases)
        except (TypeError, ValueError) as exc:
            log.warning("test_cases %.80r are not JSON (%s); the response scores 0", test_cases, exc)
            return CodeGrade(program, format_ok, test_cases, [], [], False)
    results, metadata = post_to_verifier(url, cases, program)
    first = metadata[0] if isinstance(metadata, list) and metadata else None
    passed = first is not None and all(x == 1 for x in results)
    return CodeGrade(program, format_ok, cases, results, metadata if first is None else first, passed)


@dataclass(frozen=True)
class VerifiableReward:
    """ColossalChat's rule reward ``kind`` (one of `RULE_REWARDS`) with its ``grpo_config`` settings."""

    kind: str
    max_new_tokens: int
    soft_over_length_punishment: bool = False
    cache_length: Optional[int] = None
    tags: Optional[Mapping[str, Mapping[str, Any]]] = None
    code_verifier_api_url: Optional[str] = None

    def __post_init__(self) -> None:
        if self.kind not in RULE_REWARDS:
            raise ValueError(f"reward_fn_type must be one of {list(RULE_REWARDS)}, got {self.kind!r}")
        if self.soft_over_length_punishment and not self.cache_length:
            raise ValueError("soft_over_length_punishment needs cache_length")
        if self.kind == "code" and not self.code_verifier_api_url:
            raise ValueError("reward_fn_type='code' needs grpo_config['code_verifier_api_url']")

    def length_bonus(self, length: int) -> float:
        """The soft over-length term of a response of ``length`` tokens (0 without the punishment)."""
        big, cache = self.max_new_tokens, self.cache_length
        if self.soft_over_length_punishment and big - cache < length < big:
            return ((big - cache) - length) / cache * ACC_SCORE
        return 0.0

    def score_one(self, text: str, length: int, target: Any) -> List[float]:
        """[reward, format_acc, ans_acc] of one response; ``target``: its gt_answer (math) or test_cases (code)."""
        if self.kind == "code":
            graded = grade_code(text, target, self.code_verifier_api_url)
            format_ok, ans_ok = graded.format_ok, graded.passed
            reward = (ACC_SCORE if format_ok else 0.0) + self.length_bonus(length) if ans_ok else 0.0
        else:
            answer, format_ok, score = grade_math(self.kind, text, target, self.tags)
            reward, ans_ok = 0.0, False
            if answer is not None:
                if format_ok:
                    ans_ok = score > 0
                    reward += score
                reward += self.length_bonus(length)
        if length >= self.max_new_tokens:
            reward = 0.0
        return [reward, float(format_ok), float(ans_ok)]

    def __call__(self, responses: Sequence[str], lengths: torch.Tensor, targets: Sequence[Any]) -> torch.Tensor:
        """responses: N decoded responses; lengths: [N] response tokens; targets: N gt_answers or test_cases.
        Returns [N, 3] float32: reward, format_acc, ans_acc."""
        if not (len(responses) == lengths.numel() == len(targets)):
            raise ValueError(f"{len(responses)} responses, {lengths.numel()} lengths and {len(targets)} targets")
        rows = [self.score_one(t, int(n), y) for t, n, y in zip(responses, lengths.tolist(), targets)]
        return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), 3)
