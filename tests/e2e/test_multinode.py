"""A Ray cluster of four raylets on this machine (head, two ``gen`` nodes, one ``train`` node): GRPO runs with
producers and consumers pinned to different nodes by ``role_resources``, with both weight-sync modes, then a run
that loses a producer's node mid-way. The cluster lives in a process of its own (`multinode_driver.py`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from multinode_driver import REMOVAL_ROUNDS

pytestmark = [pytest.mark.slow, pytest.mark.timed]

DRIVER = Path(__file__).with_name("multinode_driver.py")


@pytest.fixture(scope="module")
def report(tiny_model_path, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("multinode")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(DRIVER), tiny_model_path, str(data), str(out / "runs"),
                           str(out / "report.json")], cwd=DRIVER.parent, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize("mode", ["object_store", "collective"])
def test_roles_run_where_pinned_and_reward_rises(report, mode):
    run = report[mode]
    roles = run["roles"]
    assert {roles["producer-0"], roles["producer-1"]} == {"gen-a", "gen-b"}, roles
    assert roles["consumer-0"] == roles["consumer-1"] == "train", roles
    assert roles["rollout-queue"] == roles["weight-store"] == "head", "a lost worker node cannot take them along"
    assert run["steps"] == list(range(1, 11))
    start, end = run["reward"]
    assert end > start + 0.1, f"{mode}: reward {start:.3f} -> {end:.3f}"
    assert run["weight_bytes"] > 0
    c = run["counters"]
    assert c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"] and c["consumed"] == 20


def test_lost_node_moves_its_producers_work_to_the_other(report):
    run = report["node_removed"]
    lost = "producer-1"
    assert run["roles"][lost] == report["removed"]
    assert run["steps"] == list(range(1, REMOVAL_ROUNDS + 1)), "every step still trained"
    c = run["counters"]
    assert c["dead_producers"] == [lost]
    assert c["produced"] == c["consumed"] + c["dropped"] + c["in_flight"]
    assert c["consumed"] - c["lost"] == 2 * REMOVAL_ROUNDS, \
        "two rollouts a round trained on; one taken as its node went was made again"
    assert run["removal_to_recovery_s"] is not None and run["removal_to_recovery_s"] < 30
