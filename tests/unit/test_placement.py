"""coati_relay.cluster.placement: bundles sized from the run, and requests the cluster cannot hold refused before any
actor
starts, with the role, the request and what each node has."""
from __future__ import annotations

import time

import pytest

from coati_relay.cluster.placement import (
    PlacementError,
    RoleRequest,
    autoscaler_configured,
    check_satisfiable,
    role_requests,
)


def node(ip, **resources):
    return {"NodeManagerAddress": ip, "Alive": True, "Resources": {"memory": 1e9, f"node:{ip}": 1.0, **resources}}


def test_cpu_cluster_gives_every_role_an_equal_cpu_share():
    reqs = role_requests(2, 2, 1, {"CPU": 2.0}, {})
    assert [r.role for r in reqs] == ["producer-0", "producer-1", "consumer-0", "consumer-1"]
    assert all(r.resources == {"CPU": 0.5} for r in reqs)
    assert role_requests(1, 1, 1, {"CPU": 16.0}, {})[0].resources == {"CPU": 1.0}  # never more than one CPU


def test_gpu_cluster_gives_producers_their_tensor_parallel_gpus():
    reqs = role_requests(2, 2, 2, {"CPU": 16.0, "GPU": 6.0}, {"producer": {"inference": 1.0}})
    assert reqs[0].resources == {"CPU": 1.0, "GPU": 2.0, "inference": 1.0}
    assert reqs[3].resources == {"CPU": 1.0, "GPU": 1.0}
    assert "GPU" not in role_requests(2, 2, 2, {"CPU": 16.0, "GPU": 5.0}, {})[0].resources  # too few: all on CPU


def test_a_request_no_node_can_hold_names_the_role_and_the_nodes():
    nodes = [node("10.0.0.1", CPU=4.0), node("10.0.0.2", CPU=4.0, trainer=1.0)]
    with pytest.raises(PlacementError) as err:
        check_satisfiable([RoleRequest("consumer-0", {"CPU": 1.0, "GPU": 1.0})], nodes, "PACK")
    text = str(err.value)
    assert "consumer-0 asks for {'CPU': 1.0, 'GPU': 1.0}" in text and "10.0.0.2: {'CPU': 4.0, 'trainer': 1.0}" in text
    assert "autoscaler" in text
    check_satisfiable([RoleRequest("consumer-0", {"CPU": 1.0, "trainer": 1.0})], nodes, "PACK")


def test_bundles_that_fit_alone_but_not_together_are_refused():
    nodes = [node("a", CPU=2.0, trainer=1.0), node("b", CPU=2.0)]
    two = [RoleRequest(f"consumer-{i}", {"CPU": 0.5, "trainer": 1.0}) for i in range(2)]
    with pytest.raises(PlacementError, match=r"need more than the cluster has.*'trainer': \(2.0, 1.0\)"):
        check_satisfiable(two, nodes, "PACK")
    four = [RoleRequest(f"r{i}", {"CPU": 1.0}) for i in range(4)]
    check_satisfiable(four, nodes, "SPREAD")
    with pytest.raises(PlacementError, match="STRICT_PACK"):
        check_satisfiable(four, nodes, "STRICT_PACK")
    with pytest.raises(PlacementError, match="STRICT_SPREAD"):
        check_satisfiable(four[:3], nodes, "STRICT_SPREAD")
    dead = [{**node("c", CPU=64.0), "Alive": False}]
    with pytest.raises(PlacementError, match="no node can hold"):
        check_satisfiable([RoleRequest("producer-0", {"CPU": 8.0})], nodes + dead, "PACK")


@pytest.mark.slow
def test_unschedulable_run_fails_in_seconds_naming_the_role(ray_cluster, tiny_model_path, tmp_path):
    from coati_relay import launch_distributed
    from coati_relay.toy import write_toy_dataset

    data = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=8)
    deadline = time.monotonic() + 30
    while autoscaler_configured() is None and time.monotonic() < deadline:  # a fresh cluster's monitor writes it
        time.sleep(0.5)
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match=r"producer-0 asks for .*'inference_node': 1.0.*no node can hold.*"
                                             r"This cluster has no autoscaler to add such a node"):
        launch_distributed(
            num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1, inference_batch_size=4,
            inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
            train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
            inference_model_config={"path": tiny_model_path}, train_model_config={"path": tiny_model_path},
            generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0},
            grpo_config={"reward_fn_type": "toy_letter"}, plugin_config={},
            num_generations=2,
            role_resources={"producer": {"inference_node": 1}}, run_dir=str(tmp_path / "run"), progress=False)
    assert time.monotonic() - t0 < 30
    assert not [a for a in ray_cluster.util.list_named_actors(all_namespaces=True) if "coati-relay/" in str(a)]


def test_service_actors_go_to_the_head_node(ray_cluster):
    from coati_relay.cluster.placement import node_id, on_head_node

    strategy = on_head_node()["scheduling_strategy"]
    assert strategy.node_id == node_id(), "the one node of the test cluster is its head"
    assert not strategy.soft, "a soft affinity may spill the actor to a worker node"


def test_with_an_autoscaler_a_shortfall_warns_and_waits(caplog):
    nodes = [node("10.0.0.1", CPU=4.0)]
    gpu = [RoleRequest("consumer-0", {"CPU": 1.0, "GPU": 1.0})]
    with pytest.raises(PlacementError, match="This cluster has no autoscaler to add such a node"):
        check_satisfiable(gpu, nodes, "PACK", autoscaler=False)
    with caplog.at_level("WARNING", logger="coati_relay.cluster.placement"):
        check_satisfiable(gpu, nodes, "PACK", autoscaler=True)
    assert "consumer-0 asks for {'CPU': 1.0, 'GPU': 1.0}" in caplog.text and "autoscaler may add" in caplog.text


def test_autoscaler_detection_reads_the_monitor_status(ray_cluster, monkeypatch):
    import json

    from ray.experimental import internal_kv

    from coati_relay.cluster import placement
    assert placement.autoscaler_configured() in (False, None), "a local ray.init cluster has no node provider"

    def status(mapping):
        return json.dumps({"load_metrics_report": {}, "autoscaler_report": {"node_type_mapping": mapping}}).encode()

    for raw, expected in [(status({"ab12": "node_ab12"}), False), (status({"ab12": "gpu-worker"}), True),
                          (b'{"load_metrics_report": {}}', None), (None, None), (b"{cut", None)]:
        monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key, raw=raw: raw)
        assert placement.autoscaler_configured() is expected, raw


# -- fewer GPUs than roles ---------------------------------------------------------------------------------------------
def test_an_actor_placed_without_a_gpu_is_given_no_cuda_device():
    """Ray 2.60 leaves a ``num_gpus=0`` actor the node's CUDA_VISIBLE_DEVICES: the options hide the GPUs from it, so
    a run placed on CPU (fewer GPUs than roles) does not put every role on ``cuda:0``."""
    from coati_relay.cluster.placement import actor_options

    cpu_opts = actor_options(None, 0, RoleRequest("consumer-0", {"CPU": 0.5}), cpu_env={"OMP_NUM_THREADS": "1"})
    assert cpu_opts["num_gpus"] == 0
    assert cpu_opts["runtime_env"]["env_vars"] == {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    gpu_opts = actor_options(None, 1, RoleRequest("producer-0", {"CPU": 1.0, "GPU": 1.0}), cpu_env={"X": "1"})
    assert gpu_opts["num_gpus"] == 1.0 and "runtime_env" not in gpu_opts, "Ray sets a GPU actor's devices itself"


@pytest.mark.slow
def test_a_cpu_placed_actor_sees_no_cuda_device_in_its_process(ray_cluster):
    from ray.util.placement_group import remove_placement_group

    from coati_relay.cluster.placement import actor_options, reserve

    @ray_cluster.remote
    class Probe:
        def env(self):
            import os

            import torch

            return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("OMP_NUM_THREADS"), torch.cuda.device_count()

    request = RoleRequest("consumer-0", {"CPU": 0.1})
    pg = reserve([request], "PACK", timeout_s=30)
    try:
        probe = Probe.options(**actor_options(pg, 0, request, cpu_env={"OMP_NUM_THREADS": "1"})).remote()
        assert ray_cluster.get(probe.env.remote(), timeout=60) == ("", "1", 0)
        ray_cluster.kill(probe)
    finally:
        remove_placement_group(pg)


def test_a_cuda_plugin_with_roles_placed_on_cpu_is_refused_before_any_actor_starts():
    from coati_relay.launch import check_plugin_placement

    on_cpu = role_requests(2, 2, 1, {"CPU": 8.0, "GPU": 2.0}, {})  # 4 roles, 2 GPUs: every role on CPU
    with pytest.raises(PlacementError, match=r"'zero2' needs CUDA.*allow_cpu_fallback"):
        check_plugin_placement(on_cpu, "zero2", allow_cpu_fallback=False)
    check_plugin_placement(on_cpu, "zero2", allow_cpu_fallback=True)  # trains with ddp on CPU, as asked
    check_plugin_placement(on_cpu, "ddp", allow_cpu_fallback=False)
    check_plugin_placement(role_requests(1, 1, 1, {"CPU": 8.0, "GPU": 2.0}, {}), "gemini", allow_cpu_fallback=False)


@pytest.mark.slow
def test_launch_refuses_a_cuda_plugin_it_would_place_on_cpu(ray_cluster, tiny_model_path, tmp_path, monkeypatch):
    """A driver with CUDA accepts zero2; the cluster (no GPU here) places the roles on CPU: refused in seconds."""
    from coati_relay import launch_distributed
    from coati_relay.toy import write_toy_dataset
    from coati_relay.training import plugins

    monkeypatch.setattr(plugins, "_cuda_available", lambda: True)
    data = write_toy_dataset(tmp_path / "p.jsonl", num_prompts=8)
    with pytest.raises(PlacementError, match="'zero2' needs CUDA"):
        launch_distributed(
            num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1, inference_batch_size=4,
            inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
            train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
            inference_model_config={"path": tiny_model_path}, train_model_config={"path": tiny_model_path},
            generate_config={"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0},
            grpo_config={"reward_fn_type": "toy_letter"},
            plugin_config={"plugin": "zero2"},
            num_generations=2, run_dir=str(tmp_path / "run"), progress=False)
    assert not [a for a in ray_cluster.util.list_named_actors(all_namespaces=True) if "coati-relay/" in str(a)]
