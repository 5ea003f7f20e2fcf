"""Placement of the roles on the Ray cluster: one placement group, one bundle per producer and consumer.

Each bundle asks for what its role needs: on a cluster with a GPU for every role, a producer takes
``num_proc_per_producer`` GPUs and a consumer one; otherwise each role takes an equal share of the CPUs (never more
than the cluster has). ``role_resources`` adds custom resources per role (``{"producer": {"inference_node": 1}}``),
which pins roles to the nodes that declare them. Before any model loads, `check_satisfiable` refuses a request no
node can hold, naming the role, the request, what each node has and whether an autoscaler could add a node (where
the cluster has one, the shortfall only warns: the autoscaler may add the nodes); `reserve` then waits at most
``placement_timeout_s`` for the resources to be free.
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from coati_relay.cluster.local_ray import METRICS_ENV
from coati_relay.cluster.waiting import until_cancelled

log = logging.getLogger(__name__)

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ROLES = ("producer", "consumer")
HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node only
AUTOSCALING_STATUS_KEY = "__autoscaling_status"  # where Ray's monitor writes its status (ray_constants)
NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": ""}  # what makes an actor placed without a GPU see none


class PlacementError(RuntimeError):
    """The cluster cannot hold the run's actors (now, or ever); the message says which role and why."""


@dataclass(frozen=True)
class RoleRequest:
    """role: e.g. ``producer-0``; resources: its bundle (``CPU``, ``GPU`` and custom resources)."""

    role: str
    resources: Dict[str, float]


def role_requests(num_producers: int, num_consumers: int, gpus_per_producer: int,
                  cluster: Mapping[str, float], role_resources: Mapping[str, Mapping[str, float]]) -> List[RoleRequest]:
    """The bundles of a run, producers first: GPUs when the cluster has one for every role, else CPU shares."""
    cpus, gpus = float(cluster.get("CPU", 1)), float(cluster.get("GPU", 0))
    n = num_producers + num_consumers
    share = max(0.01, min(1.0, cpus / n))
    on_gpus = gpus >= num_producers * gpus_per_producer + num_consumers
    if gpus and not on_gpus:
        log.warning("the cluster has %g GPUs for %d actors; every role runs on CPU", gpus, n)
    out = []
    for role, count, gpu in (("producer", num_producers, gpus_per_producer), ("consumer", num_consumers, 1)):
        base = {"CPU": share, **({"GPU": float(gpu)} if on_gpus else {})}
        out += [RoleRequest(f"{role}-{i}", {**base, **role_resources.get(role, {})}) for i in range(count)]
    return out


def _fits(request: Mapping[str, float], capacity: Mapping[str, float]) -> bool:
    return all(capacity.get(k, 0.0) >= v for k, v in request.items() if v > 0)


def _describe(nodes: Sequence[Mapping[str, Any]]) -> str:
    def totals(node):
        return {k: v for k, v in node["Resources"].items() if not k.startswith(("node:", "memory", "object_store"))}

    return "; ".join(f"{node.get('NodeManagerAddress', '?')}: {totals(node)}" for node in nodes)


def autoscaler_configured() -> Optional[bool]:
    """Whether the cluster's autoscaler can add nodes, from the status Ray's monitor writes: True when it names a
    node type of an autoscaling config, False when every node has the anonymous type (``node_<id>``) of the
    read-only provider every plain ``ray start``/``ray.init`` cluster runs, None when there is no such status (an
    unknown set-up)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    if not _internal_kv_initialized():
        return None
    raw = _internal_kv_get(AUTOSCALING_STATUS_KEY)
    try:
        types = json.loads(raw)["autoscaler_report"]["node_type_mapping"] if raw else None
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(types, dict):
        return None
    return any(kind != f"node_{node}" for node, kind in types.items())


def check_satisfiable(requests: Sequence[RoleRequest], nodes: Sequence[Mapping[str, Any]], strategy: str,
                      autoscaler: Optional[bool] = False) -> None:
    """Raises `PlacementError` when no alive node could ever hold some role's bundle (by node totals), or when the
    bundles together exceed the cluster (or one node, for STRICT_PACK; distinct nodes, for STRICT_SPREAD).

    With ``autoscaler=True`` (see `autoscaler_configured`) a shortfall only warns: the autoscaler may add the nodes
    while `reserve` waits ``placement_timeout_s``.
    """
    alive = [n for n in nodes if n.get("Alive", True)]
    scaler = {True: "This cluster's autoscaler may add such a node",
              False: "This cluster has no autoscaler to add such a node",
              None: "An autoscaler could add such a node only if this cluster has one configured"}[autoscaler]
    where = (f"the cluster has {len(alive)} node(s): {_describe(alive)}. {scaler}; otherwise lower the request or "
             f"add the resource to a node (ray start --resources=...)")
    problems = [f"{req.role} asks for {req.resources}, which no node can hold" for req in requests
                if not any(_fits(req.resources, n["Resources"]) for n in alive)]
    totals: Counter = sum((Counter(n["Resources"]) for n in alive), Counter())
    need: Counter = sum((Counter(req.resources) for req in requests), Counter())
    if strategy == "STRICT_PACK" and not any(_fits(need, n["Resources"]) for n in alive):
        problems.append(f"placement_strategy='STRICT_PACK' puts every role on one node, which needs {dict(need)}")
    if strategy == "STRICT_SPREAD" and len(requests) > len(alive):
        problems.append(f"placement_strategy='STRICT_SPREAD' needs a node per role ({len(requests)} roles)")
    short = {k: (v, totals.get(k, 0.0)) for k, v in need.items() if totals.get(k, 0.0) + 1e-9 < v}
    if short and not problems:
        problems.append(f"the roles together need more than the cluster has (resource: (needed, total)) {short}")
    if not problems:
        return
    if autoscaler:
        log.warning("%s: %s; waiting for it up to placement_timeout_s", problems[0], where)
        return
    raise PlacementError(f"{problems[0]}: {where}")


def reserve(requests: Sequence[RoleRequest], strategy: str, timeout_s: float):
    """A ready placement group with one bundle per request; `PlacementError` (and nothing reserved) when the
    resources are not free within ``timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([dict(r.resources) for r in requests], strategy=strategy)
    try:
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    except BaseException:  # Ctrl-C while waiting: release what was asked for
        remove_placement_group(pg)
        raise
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"the roles' resources were not free within placement_timeout_s={timeout_s:g}s "
                             f"(requests: {[(r.role, r.resources) for r in requests]}; free now: "
                             f"{ray.available_resources()}); other work holds them: wait for it, or raise "
                             f"placement_timeout_s")
    return pg


def on_head_node() -> Dict[str, Any]:
    """Actor options that keep a service actor (the rollout queue, the weight store) on the cluster's head node:
    they hold no model, and a worker node lost mid-run must not take the run's bookkeeping with it (the head going
    down ends the cluster anyway). Hard: a soft affinity lets Ray spill the actor to a worker node when the head's
    raylet is busy starting workers (seen with four raylets on one host). Where Ray names no head node, Ray places
    them."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    heads = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and HEAD_RESOURCE in n.get("Resources", {})]
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(heads[0], soft=False)} if heads else {}


# Ray actor options of the run's service actors (the rollout queue, the weight store). No CPU reserved: they only
# move references. No task events: the roles call them a dozen times a round, and Ray's GCS keeps an event record of
# every call of an actor that reports them (up to ``RAY_task_events_max_num_task_in_gcs``, 100,000 by default), so a
# long run's GCS grew with every round. No Ray metrics in their processes, on any cluster (a cluster the run starts
# records none anyway, `coati_relay.cluster.local_ray`): on one started with metrics, recording them grew the queue
# 1.25 and the store 0.83 KiB a round in the toy soak; ``RAY_enable_metrics_collection`` in the driver's environment
# is passed on instead.
SERVICE_ACTOR_OPTIONS: Dict[str, Any] = {
    "num_cpus": 0, "max_concurrency": 1000, "enable_task_events": False,
    "runtime_env": {"env_vars": {METRICS_ENV: os.environ.get(METRICS_ENV, "0")}}}


class ServiceActor:
    """Base of the run's service actors (the rollout queue, the weight store): what the driver asks of each."""

    async def watch(self) -> None:
        """Pending for the actor's life: see `coati_relay.cluster.waiting.until_cancelled`."""
        await until_cancelled()

    def node(self) -> str:
        """The Ray node this actor runs on."""
        return node_id()


def node_id() -> str:
    """The id of the Ray node this process runs on ("" outside Ray): what a role reports as where it ran."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def actor_options(pg: Any, index: int, request: RoleRequest,
                  cpu_env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Ray actor options that run an actor in bundle ``index`` of ``pg`` with exactly that bundle's resources.

    An actor whose bundle holds no GPU gets ``cpu_env`` and `NO_GPU_ENV` as its environment: Ray 2.60 leaves a
    ``num_gpus=0`` actor the node's ``CUDA_VISIBLE_DEVICES``, so without it every role of a run placed on CPU (fewer
    GPUs than roles) would take ``cuda:0``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    custom = {k: v for k, v in request.resources.items() if k not in ("CPU", "GPU")}
    gpus = request.resources.get("GPU", 0)
    env = {} if gpus else {"runtime_env": {"env_vars": {**(cpu_env or {}), **NO_GPU_ENV}}}
    return {"num_cpus": request.resources.get("CPU", 0), "num_gpus": gpus,
            **({"resources": custom} if custom else {}), **env,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                    placement_group_bundle_index=index)}
