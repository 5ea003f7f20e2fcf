"""The multi-node run, in a process of its own (a `ray.cluster_utils.Cluster` cannot share a process with another
Ray session): four raylets on this machine, producers pinned to the two ``gen`` nodes and consumers to the
``train`` node by custom resources. Writes a JSON report for `test_multinode.py` to check.

usage: python multinode_driver.py MODEL_DIR DATA_JSONL RUN_DIR REPORT_JSON
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from run_helpers import AfterSteps, rose, run_kwargs  # noqa: I001 (this folder is on sys.path)

PINS = {"producer": {"gen": 1}, "consumer": {"train": 1}}
REMOVAL_ROUNDS = 24


class DeathLog(logging.Handler):
    """Remembers when the driver logged that a producer died."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.died_at = None

    def emit(self, record):
        if self.died_at is None and "died" in record.getMessage():
            self.died_at = time.monotonic()


def start_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = {"head": cluster.head_node, "gen-a": cluster.add_node(num_cpus=1, resources={"gen": 1}),
             "gen-b": cluster.add_node(num_cpus=1, resources={"gen": 1}),
             "train": cluster.add_node(num_cpus=2, resources={"train": 2})}
    cluster.wait_for_nodes()
    return cluster, nodes


def run_on(model, data, run_dir, **over):
    from coati_relay import launch_distributed

    kw = run_kwargs(model, data, run_dir, **{"backend": "transformers", "rounds": 10, "role_resources": PINS, **over})
    return launch_distributed(**kw)


def summary(result, nodes):
    names = {node.node_id: name for name, node in nodes.items()}
    start, end = rose(result.history)
    return {"roles": {role: names.get(node, node) for role, node in result.nodes.items()}, "reward": [start, end],
            "steps": [h["step"] for h in result.history], "counters": result.counters,
            "weight_bytes": result.history[0]["weight_bytes"]}


def main(model: str, data: str, run_dir: str, report_path: str) -> None:
    cluster, nodes = start_cluster()
    try:
        run_all(cluster, nodes, model, data, run_dir, report_path)
    finally:
        import ray

        ray.shutdown()  # Cluster.shutdown refuses to remove the head node while this driver is connected to it
        cluster.shutdown()  # also forgets the cluster's address, which a later ray.init() would try to join


def run_all(cluster, nodes, model: str, data: str, run_dir: str, report_path: str) -> None:
    import ray
    from ray.util.placement_group import placement_group_table

    ray.init(address=cluster.address, log_to_driver=False)
    report = {}
    for mode in ("object_store", "collective"):
        report[mode] = summary(run_on(model, data, Path(run_dir) / mode, weight_sync=mode), nodes)

    def remove_producer_1_node():
        pg, = [pg for pg in placement_group_table().values() if pg["state"] == "CREATED"]
        node_id = pg["bundles_to_node_id"][1]  # bundles: producers first
        name, = [name for name, node in nodes.items() if node.node_id == node_id]
        report["removed"] = name
        removed_at.append(time.monotonic())
        cluster.remove_node(nodes[name], allow_graceful=False)

    removed_at = []
    deaths = DeathLog()
    logging.getLogger("coati_relay.launch").addHandler(deaths)
    removal = AfterSteps(Path(run_dir) / "removed", 2, remove_producer_1_node)
    removal.start()
    # Rounds enough that the loss lands mid-run on a fast host: with 10 the run once ended before the node went.
    result = run_on(model, data, Path(run_dir) / "removed", on_producer_failure="continue", rounds=REMOVAL_ROUNDS)
    report["node_removed"] = summary(result, nodes)
    report["node_removed"]["removal_to_recovery_s"] = (None if not removed_at or deaths.died_at is None
                                                      else deaths.died_at - removed_at[0])
    Path(report_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:5])
