"""Long-run hygiene (a soak): the resident memory (RSS) of every process of a GRPO run over many rounds of the toy
task, in both placements, and how fast each grows per round.

Each placement runs in a fresh process (`coati_relay.observe.memory_soak.soak`): GRPO on the toy task with the
transformers
backend, 8 prompts x 4 samples of 8 new tokens a round, one producer and one consumer, no checkpoint during the
run. Its process tree is sampled four times a second and filed by role: the driver, the four actors (consumer,
producer, rollout queue, weight store: disaggregated only), Ray's daemons (``gcs_server``, ``raylet``) and the rest
of the local Ray cluster (``ray_other``: agents, log monitor, idle workers), with ``tree`` the sum. The figure per
role is the least-squares slope of its RSS over the last 80% of the rounds, in KiB per round; the RSS after the
warm-up and at the end are recorded too.

``make bench`` runs 2,000 rounds of each placement (2 to 14 minutes each on 2 cores). It fails when the disaggregated
run misses issue 40's targets (the whole tree at most 4 KiB a round, each actor role at most 1 KiB: measured 2.2 and
0.4 at most on a quiet host, benchmarks/README.md, "Long-run memory") or when Ray's GCS grows more than
`FLAT_KIB_PER_ROUND` (4 KiB a round: it measured 0.1-0.7, and 39 before issue 40's first fix). The smoke run of
``make test`` (``--benchmark-disable``) runs 60 rounds of each and checks only that every role was sampled (too
short for a slope to mean anything).
"""
from __future__ import annotations

import logging

import pytest

from coati_relay.observe.memory_soak import ACTOR_ROLES, RAY_DAEMONS, format_report, soak

log = logging.getLogger(__name__)

TREE_KIB_PER_ROUND = 4.0  # issue 40's targets for the disaggregated tree ...
ACTOR_KIB_PER_ROUND = 1.0  # ... and for each actor role
FLAT_KIB_PER_ROUND = 4.0  # Ray's GCS may not grow more than this (above its run-to-run spread)


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_memory_over_a_long_run(benchmark, work, placement, tmp_path, request):
    rounds = 60 if request.config.getoption("benchmark_disable") else 2000
    report = benchmark.pedantic(soak, args=(placement, rounds, tmp_path / placement), rounds=1, iterations=1)
    print("\n" + format_report([report]))
    benchmark.group = f"long-run memory ({rounds} GRPO rounds, toy task)"
    work["rounds"] = rounds
    roles = report["roles"]
    expected = {"driver", "tree"} | (set(ACTOR_ROLES) | set(RAY_DAEMONS) if placement == "disaggregated" else set())
    assert expected <= set(roles), f"roles sampled: {sorted(roles)}"
    for role, figures in roles.items():
        benchmark.extra_info[f"{role}_kib_per_round"] = figures["slope_kib_per_round"]
        benchmark.extra_info[f"{role}_mib_after_warm_up"] = figures["mib_after_warm_up"]
        benchmark.extra_info[f"{role}_mib_end"] = figures["mib_end"]
    if rounds < 2000 or placement == "colocated":
        return
    slopes = {role: figures["slope_kib_per_round"] for role, figures in roles.items()}
    bounds = {"tree": TREE_KIB_PER_ROUND, "gcs_server": FLAT_KIB_PER_ROUND,
              **{role: ACTOR_KIB_PER_ROUND for role in ACTOR_ROLES}}
    over = {role: slopes[role] for role, bound in bounds.items() if slopes[role] > bound}
    benchmark.extra_info["meets_issue_40_targets"] = not over
    assert not over, f"growing faster than their bound ({bounds} KiB a round): {over}"
