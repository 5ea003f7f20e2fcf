"""Long-run hygiene: the resident memory (RSS) of every actor of a GRPO run over many steps of the toy task.

One producer (vLLM), one consumer (Booster, DDP), the rollout queue and the weight store, sampled by process title
(``ray::ProducerWorker...``) four times a second. The figures: each role's RSS after the warm-up (the first fifth
of the run), at the end, and the least-squares slope over the steps after the warm-up, in MiB per 100 steps. A leak
(references never released, a list that grows with the steps) shows as a slope that does not fade.

``make bench`` runs 200 steps; the smoke run of ``make test`` (``--benchmark-disable``) runs 40.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Dict, List, Tuple

import psutil

ROLES = {"producer": "ray::ProducerWorker", "consumer": "ray::ConsumerWorker",
         "rollout_queue": "ray::RolloutQueueActor", "weight_store": "ray::WeightStoreActor"}
MiB = 2 ** 20


def _role_processes() -> Dict[str, psutil.Process]:
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        for role, prefix in ROLES.items():
            if title.startswith(prefix):
                found[role] = proc
    return found


class RssSampler(threading.Thread):
    """Samples every role's RSS (MiB) every ``every_s`` seconds, with the number of steps logged by then."""

    def __init__(self, run_dir: Path, every_s: float = 0.25):
        super().__init__(daemon=True)
        self.metrics, self.every_s = run_dir / "metrics.jsonl", every_s
        self.samples: Dict[str, List[Tuple[int, float]]] = {role: [] for role in ROLES}
        self.stop = threading.Event()

    def run(self) -> None:
        procs: Dict[str, psutil.Process] = {}
        while not self.stop.wait(self.every_s):
            steps = len(self.metrics.read_text().splitlines()) if self.metrics.exists() else 0
            if not steps:
                continue
            if len(procs) < len(ROLES):
                procs = _role_processes()
            for role, proc in procs.items():
                try:
                    self.samples[role].append((steps, proc.memory_info().rss / MiB))
                except psutil.NoSuchProcess:  # the run ended between two looks
                    pass


def _slope_per_100(points: List[Tuple[int, float]]) -> float:
    n = len(points)
    mx = sum(s for s, _ in points) / n
    my = sum(m for _, m in points) / n
    var = sum((s - mx) ** 2 for s, _ in points)
    return 100 * sum((s - mx) * (m - my) for s, m in points) / var if var else 0.0


def test_actor_memory_over_a_long_run(benchmark, work, ray_session, tiny_model_path, tmp_path, request):
    from coati_relay import launch_distributed
    from coati_relay.toy import write_toy_dataset

    steps = 40 if request.config.getoption("benchmark_disable") else 200
    data = write_toy_dataset(tmp_path / "toy.jsonl", num_prompts=8)
    run_dir = tmp_path / "run"
    kwargs = dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=steps // 2,
        inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"path": str(data), "max_length": 32},
        inference_model_config={"path": tiny_model_path}, train_model_config={"path": tiny_model_path},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}, seed=0,
        grpo_config={"lr": 5e-3, "beta": 0.0, "reward_fn_type": "toy_letter"}, plugin_config={"plugin": "ddp"},
        inference_backend="vllm", num_generations=4, core_algo="GRPO", run_dir=str(run_dir), save_interval=10 ** 6,
        progress=False, timeout_s=120, project_name="memory")
    sampler = RssSampler(run_dir)
    sampler.start()
    try:
        result = benchmark.pedantic(launch_distributed, kwargs=kwargs, rounds=1, iterations=1)
    finally:
        sampler.stop.set()
        sampler.join()
    assert [h["step"] for h in result.history] == list(range(1, steps + 1))
    warm = steps // 5
    benchmark.group = f"long-run memory ({steps} GRPO steps, toy task)"
    work["steps"] = steps
    for role, points in sampler.samples.items():
        after = [(s, m) for s, m in points if s >= warm]
        assert len(after) >= 10, f"{role}: only {len(after)} samples after step {warm}"
        benchmark.extra_info[f"{role}_rss_warm_mib"] = round(after[0][1], 1)
        benchmark.extra_info[f"{role}_rss_end_mib"] = round(after[-1][1], 1)
        benchmark.extra_info[f"{role}_mib_per_100_steps"] = round(_slope_per_100(after), 2)
