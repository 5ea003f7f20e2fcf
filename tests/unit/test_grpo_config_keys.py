"""Each ``grpo_config`` key with the meaning ColossalChat's code gives it (4f9953be3: grpo_consumer.py, consumer.py,
producer.py, reward/reward_fn.py), shown on numbers: the rule rewards' length rules and format tags, the code reward
against a local verifier service, filter_range on answer accuracy, filter_truncated_response, dynamic_batching,
skip_threshold, and ``algo`` picking the advantage."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
from train_round_helpers import BigramLM, make_config, make_rollout, record_steps

from coati_relay import algorithms as algos
from coati_relay.rewards.verifiable import VerifiableReward, structure_valid
from coati_relay.roles.consumer import ConsumerWorker

PROMPTS = [[3, 4, 5], [6], [7, 8], [9, 10]]
RESPONSES = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [2, 2], [3, 11, 4], [5], [6, 7, 8]]


@pytest.fixture(scope="module")
def paths(tiny_model_path, tmp_path_factory):
    from coati_relay.toy import write_toy_dataset

    return tiny_model_path, str(write_toy_dataset(tmp_path_factory.mktemp("data") / "p.jsonl", num_prompts=16))


# -- the rule rewards' length rules ------------------------------------------------------------------------------
def _boxed(soft: bool) -> VerifiableReward:
    return VerifiableReward("boxed", max_new_tokens=10, soft_over_length_punishment=soft, cache_length=4)


def test_soft_over_length_penalty_below_inside_and_above_the_cache_window():
    """L = 10, c = 4: the window is 6 < len < 10, where ((L - c) - len) / c * 10 is added; len >= L scores 0."""
    texts = ["so \\boxed{4}"] * 6
    lengths = torch.tensor([5, 6, 7, 9, 10, 12])
    out = _boxed(soft=True)(texts, lengths, ["4"] * 6)
    assert out[:, 0].tolist() == [10.0, 10.0, 7.5, 2.5, 0.0, 0.0]
    assert out[:, 1].tolist() == [1.0] * 6 and out[:, 2].tolist() == [1.0] * 6  # format and answer still count
    wrong = _boxed(soft=True)(["\\boxed{5}", "no box"], torch.tensor([9, 9]), ["4", "4"])
    assert wrong[:, 0].tolist() == [-7.5, 0.0], "the penalty needs an answer, right or wrong, not a correct one"


def test_responses_reaching_max_new_tokens_score_zero_even_without_the_soft_punishment():
    out = _boxed(soft=False)(["\\boxed{4}"] * 3, torch.tensor([9, 10, 11]), ["4"] * 3)
    assert out[:, 0].tolist() == [10.0, 0.0, 0.0] and out[:, 2].tolist() == [1.0, 1.0, 1.0]


# -- response_format_tags ----------------------------------------------------------------------------------------
def test_think_answer_tags_format_counts_order_and_end():
    ok = "<think>a</think><answer>4</answer>"
    assert structure_valid(ok) and not structure_valid(ok + "\n"), "it must end with </answer>, no trailing text"
    assert not structure_valid("<answer>4</answer><think>a</think>")
    two = {"think_start": {"text": "<think>", "num_occur": 2}, "think_end": {"text": "</think>", "num_occur": 2},
           "answer_start": {"text": "<answer>", "num_occur": 1}, "answer_end": {"text": "</answer>", "num_occur": 1}}
    twice = "<think>a</think><think>b</think><answer>4</answer>"
    assert structure_valid(twice, two) and not structure_valid(twice) and not structure_valid(ok, two)
    reward = VerifiableReward("think_answer_tags", max_new_tokens=100, tags=two)
    assert reward([twice, ok], torch.tensor([5, 5]), ["4", "4"]).tolist() == [[10.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_boxed_counts_the_given_tags_too():
    tags = {"answer_start": {"text": "<answer>", "num_occur": 1}}
    reward = VerifiableReward("boxed", max_new_tokens=100, tags=tags)
    out = reward(["<answer>\\boxed{4}", "\\boxed{4}"], torch.tensor([3, 3]), ["4", "4"])
    assert out.tolist() == [[10.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


# -- reward_fn_type='code' against a local verifier service ---------------------------------------------------------
class _Verifier(BaseHTTPRequestHandler):
    """ColossalChat's verifier protocol: runs the program on each input (stdin) and compares its stdout."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        results = []
        for given, wanted in zip(body["in_outs"]["inputs"], body["in_outs"]["outputs"]):
            done = subprocess.run([sys.executable, "-c", body["generation"]], input=given, capture_output=True,
                                  text=True, timeout=body["timeout"])
            results.append(1 if done.returncode == 0 and done.stdout.strip() == wanted.strip() else -1)
        payload = json.dumps({"result": results, "metadata": [{}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def verifier_url():
    server = HTTPServer(("127.0.0.1", 0), _Verifier)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/check_correctness", server.requests
    server.shutdown()
    server.server_close()


def test_code_reward_runs_a_passing_and_a_failing_program(verifier_url):
    url, requests = verifier_url
    cases = {"inputs": ["2 3\n", "10 5\n"], "outputs": ["5\n", "15\n"]}
    good = "Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    bad = "```python\na, b = map(int, input().split())\nprint(a * b)\n```"
    bare = "a, b = map(int, input().split())\nprint(a + b)"  # passes, but no ```python block: format invalid
    reward = VerifiableReward("code", max_new_tokens=50, code_verifier_api_url=url)
    out = reward([good, bad, bare, good], torch.tensor([20, 20, 20, 50]), [cases, cases, json.dumps(cases), cases])
    assert out.tolist() == [[10.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]]
    assert requests[0] == {"in_outs": cases, "generation": "\na, b = map(int, input().split())\nprint(a + b)\n",
                           "timeout": 10, "debug": False}


def test_code_reward_names_the_key_when_the_service_is_unreachable():
    reward = VerifiableReward("code", max_new_tokens=50, code_verifier_api_url="http://127.0.0.1:9/check")
    with pytest.raises(RuntimeError, match=r"code_verifier_api_url.*cannot be reached"):
        reward(["```python\nprint(1)\n```"], torch.tensor([5]), [{"inputs": [""], "outputs": ["1"]}])


def test_code_reward_through_the_config(paths, verifier_url):
    cfg = make_config(*paths, reward_fn_type="code", code_verifier_api_url=verifier_url[0])
    assert (cfg.reward, cfg.algo.code_verifier_api_url) == ("code", verifier_url[0])


# -- the consumer's filters --------------------------------------------------------------------------------------
def test_filter_range_compares_the_groups_answer_accuracy_not_the_reward(paths):
    """Rewards 10/0 with ans_acc 1/0: group 0 (all correct, mean acc 1) leaves, group 1 (mean acc 0.5) stays; the
    reward's group means (10, 5) would drop both."""
    cfg = make_config(*paths, train_batch_size=2, filter_range=[0.01, 0.99], dynamic_batching=False, beta=0.0)
    worker = ConsumerWorker.for_models(cfg, BigramLM())
    accuracy = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert worker.learner.loss_mask(accuracy, torch.tensor([1, 1, 1, 1]), 2).tolist() == [0.0, 0.0, 1.0, 1.0]
    rollout = make_rollout(PROMPTS[:2], RESPONSES[:4], 2, [10.0, 10.0, 10.0, 0.0], policy=BigramLM())
    rollout.ans_acc = accuracy
    assert worker.train_round(rollout)["kept_fraction"] == 0.5


def test_filter_truncated_response_masks_responses_that_reach_max_new_tokens(paths):
    """generate_config max_new_tokens = 4: the responses of 4 tokens leave the loss, shorter ones stay."""
    for flag, expected in ((True, [1.0, 0.0, 1.0, 0.0]), (False, [1.0] * 4)):
        cfg = make_config(*paths, beta=0.0, filter_truncated_response=flag)
        worker = ConsumerWorker.for_models(cfg, BigramLM())
        assert worker.learner.loss_mask(torch.zeros(4), torch.tensor([2, 4, 3, 4]), 2).tolist() == expected


def test_dynamic_batching_fills_steps_with_kept_groups_and_carries_the_rest(paths):
    """filter_range (0.01, 0.99), train_batch_size 2. Round 1: groups [all right, half, all wrong, half] keep 2
    -> one step. Round 2: [half, all right, all right, all wrong] keeps 1 -> no step, carried; round 3 keeps 1 more
    -> one step of the carried group and the new one. With dynamic_batching False each round steps over its own
    groups in pairs, the out-of-range ones masked (a pair with none kept makes no step)."""
    rounds = [[1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
              [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]]
    steps = {}
    for dynamic in (True, False):
        cfg = make_config(*paths, train_batch_size=2, beta=0.0, filter_range=[0.01, 0.99], dynamic_batching=dynamic)
        worker = ConsumerWorker.for_models(cfg, BigramLM())
        grads = record_steps(worker)
        counts, carried = [], []
        for rewards in rounds:
            stats = worker.train_round(make_rollout(PROMPTS, RESPONSES, 2, rewards, policy=BigramLM()))
            counts.append(len(grads) - sum(counts))
            carried.append(stats.get("carried_groups"))
        steps[dynamic] = counts
        if dynamic:
            assert carried == [0.0, 1.0, 0.0] and stats["kept_fraction"] == 1.0
    assert steps == {True: [1, 0, 1], False: [2, 1, 1]}


# -- skip_threshold, algo ----------------------------------------------------------------------------------------
def test_skip_threshold_is_accepted_and_changes_nothing(paths):
    """ColossalChat's rl_example passes it for DAPO; its consumer never reads it."""
    assert make_config(*paths, skip_threshold=20.0).algo == make_config(*paths).algo


def test_num_minibatch_during_rollout_is_accepted_and_changes_nothing(paths):
    """ColossalChat's rl_example_zero_bubble.py passes it; no code of 4f9953be3 reads it."""
    assert make_config(*paths, num_minibatch_during_rollout=1).algo == make_config(*paths).algo


@pytest.mark.parametrize("algo,expected", [("GRPO", [1.1545, -0.5773, -0.5773]), ("RLOO", [1.0, -0.5, -0.5]),
                                           ("REINFORCE_PPB", [1.4142, -0.7071, -0.7071])])
def test_algo_selects_the_advantage_under_one_core_algo(paths, algo, expected):
    """core_algo='GRPO' for all three; grpo_config['algo'] decides, as in ColossalChat. Rewards [1, 0, 0] (mean 1/3):
    GRPO (r - mean) / (std + 1e-4) with the unbiased std 0.5774; RLOO (r - mean) * G / (G - 1); REINFORCE_PPB
    r - mean = [2/3, -1/3, -1/3] whitened (mean 0, std sqrt(2/9))."""
    cfg = make_config(*paths, beta=0.0, algo=algo, group_size=3)
    worker = ConsumerWorker.for_models(cfg, BigramLM())
    assert worker.learner.estimator is algos.get("advantage", algo) and cfg.core_algo == "GRPO"
    inputs = algos.AdvantageInputs(torch.tensor([1.0, 0.0, 0.0]), 3, torch.ones(3, 2), torch.zeros(3, 2))
    out = worker.learner.estimator(inputs, cfg.algo).advantages
    torch.testing.assert_close(out[:, 0], torch.tensor(expected), rtol=1e-3, atol=1e-3)


def test_the_producer_scores_a_rule_reward_with_its_three_columns(tiny_model_path):
    """`ProducerWorker._score_all` with reward_fn_type='boxed': decoded responses, the prompt's gt_answer repeated
    over its group, token lengths for the length rules; rewards, format_acc and ans_acc land on the rollout's rows."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from coati_relay.roles.producer import ProducerWorker

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    responses = [tok.encode(t, add_special_tokens=False) for t in ("\\boxed{4}", "\\boxed{5}", "4", "\\boxed{7}")]
    rollout = make_rollout(PROMPTS[:2], responses, 2, [0.0] * 4)
    rollout.info = {"gt_answer": ["4", "7"]}
    producer = ProducerWorker(0, SimpleNamespace(), queue=None, weight_store=None)
    producer.tokenizer, producer.rm_scorer = tok, None
    producer.rule_reward = VerifiableReward("boxed", max_new_tokens=100)
    rewards, format_acc, ans_acc = producer._score_all(rollout, ["", ""])
    assert (rewards.tolist(), format_acc.tolist(), ans_acc.tolist()) == (
        [10.0, 0.0, 0.0, 10.0], [1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0])
