"""Helpers of the engine's end-to-end tests: the toy run's keywords, and a thread that injects a fault once a run
has logged some steps."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple


def run_kwargs(model, data, run_dir, algo="GRPO", backend="vllm", rounds=12, **over):
    """`launch_distributed` keywords of the toy task: 2 producers, 2 consumers, 4 prompts x 4 responses a round."""
    group = 4
    kw = dict(
        num_producers=2, num_proc_per_producer=1, num_consumer_procs=2, num_episodes=rounds,
        inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"path": str(data), "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model}, train_model_config={"path": model},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "seed": 0},
        # one round per episode: ColossalChat's default LR cosine (T = min(episodes, 4) rounds) would swing every few
        # rounds; these runs check the engine's mechanics at a constant LR (the schedule: unit tests)
        grpo_config={"lr": 5e-3, "critic_lr": 5e-3, "beta": 0.0, "kl_coef": 0.0, "reward_fn_type": "toy_letter",
                     "lr_scheduler": "constant"},
        plugin_config={"plugin": "ddp"}, inference_backend=backend, num_generations=group, core_algo=algo,
        run_dir=str(run_dir), save_interval=1000, progress=False, timeout_s=120, export_dir=False,
    )
    kw.update(over)
    return kw


def rose(history, key="reward") -> Tuple[float, float]:
    """(mean of the first quarter, mean of the last quarter) of ``key`` over a run's history."""
    r = [h[key] for h in history]
    k = max(2, len(r) // 4)
    return sum(r[:k]) / k, sum(r[-k:]) / k


def logged_steps(run_dir: Path) -> int:
    path = Path(run_dir) / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_actors(ray, suffix: str = "") -> List[Tuple[str, str]]:
    """(namespace, name) of the live named actors of engine runs whose name ends with ``suffix``."""
    return [(a["namespace"], a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("coati-relay/") and a["name"].endswith(suffix)]


def kill_actor(ray, suffix: str) -> Callable[[], None]:
    """An action that kills the run's actor named ``.../<suffix>`` (producer-0, rollout-queue, weight-store...)."""
    def kill() -> None:
        (namespace, name), = run_actors(ray, "/" + suffix)
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
    return kill


class AfterSteps(threading.Thread):
    """Runs ``action`` once ``run_dir/metrics.jsonl`` holds ``steps`` records; ``fired_at`` is when it did."""

    def __init__(self, run_dir, steps: int, action: Callable[[], None], give_up_s: float = 600):
        super().__init__(daemon=True)
        self.run_dir, self.steps, self.action, self.give_up_s = Path(run_dir), steps, action, give_up_s
        self.fired_at: Optional[float] = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        deadline = time.monotonic() + self.give_up_s
        while time.monotonic() < deadline:
            if logged_steps(self.run_dir) >= self.steps:
                try:
                    self.action()
                    self.fired_at = time.monotonic()
                except BaseException as exc:  # seen by the test through .error
                    self.error = exc
                return
            time.sleep(0.1)

    def seconds_since_fired(self) -> float:
        assert self.fired_at is not None, f"the fault never fired: {self.error!r}"
        return time.monotonic() - self.fired_at
