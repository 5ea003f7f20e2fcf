"""The rule rewards against ColossalChat's own outputs (tests/data/colossalchat/rewards.json, recorded at 4f9953be3).

Every recorded case runs through the engine's reward (`VerifiableReward` in training mode, `grade_for_eval` in
evaluation mode; code cases replay the recorded verifier answers from a local HTTP server) and must give the same
reward, format and answer flags and evaluation fields. A case the engine answers differently on purpose is listed in
`DECLARED` with the reason, and the test checks that the engine still answers it the declared way.
"""
from __future__ import annotations

import copy
import http.server
import json
import math
import threading
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from coati_relay.rewards import get_reward_fn
from coati_relay.rewards.eval_grading import grade_for_eval
from coati_relay.rewards.verifiable import VerifiableReward

TABLE = json.loads((Path(__file__).parents[1] / "data" / "colossalchat" / "rewards.json").read_text())
REWARDS = TABLE["rewards"]
LENGTH_KEYS = ("max_new_tokens", "soft_over_length_punishment", "cache_length")

# (reward, why) -> (reason, what the engine answers instead)
DECLARED = {
    ("think_answer_tags", "gt_answer 42"): ("ColossalChat raises AttributeError on a gt_answer that is not a str; "
                                            "the engine compares its str()", "same as gt_answer '42'"),
    ("boxed", "gt_answer 42"): ("ColossalChat raises AttributeError on a gt_answer that is not a str; the engine "
                                "compares its str()", "same as gt_answer '42'"),
    ("code", "no test cases"): ("ColossalChat scores a prompt without test_cases 0 without a word (a dataset "
                                "lacking the field trains on zeros); the engine raises naming the field",
                                {"raises": "ValueError"}),
    ("code", "service unreachable"): ("ColossalChat scores 0 when the verifier cannot be reached; the engine raises "
                                      "naming the URL", {"raises": "RuntimeError"}),
}


class Verifier:
    """A local stand-in for the code verifier: answers each post with the next recorded answer."""

    def __init__(self):
        self.answers, self.received = [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                outer.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status, body = outer.answers.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/check_correctness"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def load(self, case):
        self.answers = [(x["status"], x["body"]) for x in case["verifier_exchanges"] if "status" in x]
        self.received = []


@pytest.fixture(scope="module")
def verifier():
    v = Verifier()
    yield v
    v.server.shutdown()


def _dead_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/check_correctness"


def engine_outputs(name, case, verifier=None):
    """The engine's answer to a recorded case, in the recorded shape (or ``{"raises": exception name}``)."""
    kw = case["kwargs"]
    target = case["test_cases"] if name == "code" else case["gt_answer"]
    url = None
    if name == "code":
        url = _dead_url() if case["service"] == "unreachable" else verifier.url
        verifier.load(case)
    try:
        if case["eval_mode"]:
            return grade_for_eval(name, [case["response"]], [copy.deepcopy(target)], [case["prompt"]],
                                  [case["response_length"]], tags=kw.get("tags"), code_verifier_api_url=url)[0]
        reward = VerifiableReward(name, max_new_tokens=kw["max_new_tokens"],
                                  soft_over_length_punishment=kw.get("soft_over_length_punishment", False),
                                  cache_length=kw.get("cache_length"), tags=kw.get("tags"), code_verifier_api_url=url)
        out = reward([case["response"]], torch.tensor([case["response_length"]]), [copy.deepcopy(target)])[0]
        return dict(zip(("reward", "format_acc", "ans_acc"), out.tolist()))
    except Exception as exc:
        return {"raises": type(exc).__name__}


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def differences(name, cases, verifier=None):
    """[(case id, ColossalChat's outputs, the engine's)] for the cases that disagree and are not declared."""
    found = []
    for case in cases:
        if (name, case["why"]) in DECLARED:
            continue
        got = engine_outputs(name, case, verifier)
        posted_ok = name != "code" or verifier.received == [x["payload"] for x in case["verifier_exchanges"]
                                                             if "status" in x]
        if not _same(case["colossalchat"], got) or not posted_ok:
            found.append((case["id"], case["colossalchat"], got))
    return found


def test_table_header_and_sizes():
    src = TABLE["source"]
    assert src["commit"] == "4f9953be3" and src["repository"] == "hpcaitech/ColossalAI"
    assert src["math_verify"] == version("math-verify"), "the table was recorded with another math-verify"
    for name, fn in [("think_answer_tags", "math_reward_fn"), ("boxed", "boxed_math_reward_fn"),
                     ("code", "code_reward_fn")]:
        cases = REWARDS[name]["cases"]
        assert REWARDS[name]["function"] == fn and len(cases) >= 60
        assert {c["eval_mode"] for c in cases} == {False, True}


@pytest.mark.parametrize("name", ["think_answer_tags", "boxed", "code"])
def test_engine_matches_colossalchat(name, verifier):
    found = differences(name, REWARDS[name]["cases"], verifier)
    assert not found, f"{len(found)} case(s) differ from ColossalChat: " + "; ".join(map(str, found[:5]))


@pytest.mark.parametrize("key", sorted(DECLARED))
def test_declared_differences_hold(key, verifier):
    name, why = key
    _, engine = DECLARED[key]
    cases = [c for c in REWARDS[name]["cases"] if c["why"] == why]
    assert cases, f"no recorded case {key}"
    for case in cases:
        got = engine_outputs(name, case, verifier)
        assert not _same(case["colossalchat"], got)
        if engine == "same as gt_answer '42'":
            as_str = engine_outputs(name, dict(case, gt_answer="42"))
            assert _same({**got, "gold": "42"} if "gold" in got else got, as_str) and got["reward"] == 10.0
        else:
            assert got == engine


@pytest.mark.parametrize("name", ["think_answer_tags", "boxed"])
def test_registered_names_match_training_rewards(name):
    """``get_reward_fn(name)`` (text only, default tags) gives ColossalChat's training reward, except where tokens
    count: it sees no lengths, so a response at or past max_new_tokens, or in the soft window, keeps its reward;
    and a missing or non-str gt_answer scores as documented instead of raising."""
    fn = get_reward_fn(name)
    checked = 0
    for case in REWARDS[name]["cases"]:
        if case["eval_mode"] or case["kwargs"].get("tags") or case["length_setting"] != "long_limit":
            continue
        if case["gt_answer"] is None or not isinstance(case["gt_answer"], str):
            continue
        got = fn([case["response"]], [case["gt_answer"]], [case["prompt"]]).item()
        assert _same(got, case["colossalchat"]["reward"]), case["id"]
        checked += 1
    assert checked >= 50


def test_a_planted_difference_is_caught(verifier):
    """The comparison is not vacuous: a perturbed recorded output is reported."""
    for name, field in [("think_answer_tags", "reward"), ("boxed", "ans_acc"), ("code", "format_acc")]:
        cases = [c for c in REWARDS[name]["cases"] if not c["eval_mode"] and (name, c["why"]) not in DECLARED][:3]
        planted = copy.deepcopy(cases)
        planted[1]["colossalchat"][field] += 1.0
        assert [d[0] for d in differences(name, planted, verifier)] == [planted[1]["id"]]
    evals = [c for c in REWARDS["boxed"]["cases"] if c["eval_mode"]][:2]
    planted = copy.deepcopy(evals)
    planted[0]["colossalchat"]["parsed"] = "something else"
    assert [d[0] for d in differences("boxed", planted)] == [planted[0]["id"]]
    code = copy.deepcopy([c for c in REWARDS["code"]["cases"] if c["verifier_exchanges"]][:1])
    code[0]["verifier_exchanges"][0]["payload"]["generation"] += "# not what was posted"
    assert [d[0] for d in differences("code", code, verifier)] == [code[0]["id"]]
