"""Memory soak: run the toy GRPO task for many rounds in a child process and sample the resident memory (RSS) of
its whole process tree, role by role, against the rounds it has logged.

A run in a fresh process (``python benchmarks/memory_soak.py --child ...``) holds only what that run holds: the
driver, and in the disaggregated placement the local Ray cluster it starts (``gcs_server``, ``raylet``, Ray's agents,
the idle workers) and the actors of the roles. `TreeSampler` walks that tree every ``every_s`` seconds and files each
process under a role by its process title: ``driver`` (the child itself), ``consumer``, ``producer``,
``rollout_queue``, ``weight_store`` (the actors, ``ray::ConsumerWorker...``), ``gcs_server`` and ``raylet`` (Ray's
daemons), ``ray_other`` (everything else Ray started: its agents, log monitor, idle workers).
Each sample is ``(round, KiB)``, the round being the number of lines of the run's ``metrics.jsonl`` at that moment.

`slope_kib_per_round` is the least-squares slope of a role's samples over the last 80% of the run (the first 20% is
the warm-up: allocator arenas, lazy imports, compiled kernels). A leak (a list appended each round, references
never released) shows as a slope that stays; the colocated placement, one process with no Ray, is the floor the
disaggregated one is compared with.

Used by ``benchmarks/test_long_run_memory.py`` (``make bench``: 2,000 rounds of each placement) and by the slow test
``tests/e2e/test_memory_soak.py`` (a short soak with a bound per role). From the command line::

    python benchmarks/memory_soak.py --placement disaggregated --rounds 2000 --out soak.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

KiB = 1024
ACTOR_ROLES = {"consumer": "ray::ConsumerWorker", "producer": "ray::ProducerWorker",
               "rollout_queue": "ray::RolloutQueueActor", "weight_store": "ray::WeightStoreActor"}
RAY_DAEMONS = ("gcs_server", "raylet")
ROLES = ("driver", *ACTOR_ROLES, *RAY_DAEMONS, "ray_other")
PLACEMENTS = ("colocated", "disaggregated")
# one_episode: the run is one episode over a file of every round's prompts, one checkpoint at its end;
# many_episodes: episodes of EPISODE_ROUNDS rounds over one small file, a checkpoint after each (ColossalChat's cadence)
SHAPES = ("one_episode", "many_episodes")
EPISODE_ROUNDS = 8
WARM_UP_FRACTION = 0.2
PROMPTS_PER_ROUND = 8


def soak_kwargs(model_path: str, data_path: str, run_dir: str, colocate: bool, episodes: int = 1) -> Dict[str, Any]:
    """`launch_distributed` keywords of the soak: GRPO on the toy task, transformers backend, 8 prompts x 4 samples
    of 8 new tokens a round (two tasks of 4 prompts), one producer and one consumer, ``episodes`` episodes over
    ``data_path`` and a checkpoint after each episode's last round only (ColossalChat's cadence with no
    ``save_interval``): a file of ``PROMPTS_PER_ROUND * rounds`` prompts makes one episode with one checkpoint, a
    file of ``PROMPTS_PER_ROUND * EPISODE_ROUNDS`` prompts a checkpoint every `EPISODE_ROUNDS` rounds."""
    return dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=episodes,
        inference_batch_size=PROMPTS_PER_ROUND, inference_microbatch_size=4, train_batch_size=8, train_minibatch_size=8,
        train_dataset_config={"path": data_path, "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model_path}, train_model_config={"path": model_path},
        generate_config={"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}, seed=0,
        grpo_config={"lr": 5e-3, "beta": 0.0, "reward_fn_type": "toy_letter"}, plugin_config={"plugin": "ddp"},
        inference_backend="transformers", num_generations=4, core_algo="GRPO", run_dir=run_dir,
        save_interval=10 ** 9, progress=False, timeout_s=120, project_name="soak", colocate=colocate)


def role_of(cmdline: Sequence[str], pid: int, driver_pid: int) -> str:
    """The role a process of the tree plays, from its process title (``cmdline``)."""
    if pid == driver_pid:
        return "driver"
    title = " ".join(cmdline)
    for role, prefix in ACTOR_ROLES.items():
        if title.startswith(prefix):
            return role
    program = os.path.basename(cmdline[0]) if cmdline else ""
    return program if program in RAY_DAEMONS else "ray_other"


RSS_PARTS = {"RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem"}


def rss_parts_kib(pid: int) -> Dict[str, float]:
    """A process's RSS by kind of page, KiB (``/proc/PID/status``): ``anon``, its private memory (heaps, stacks: what
    a leak grows); ``file``, pages of mapped files (the code of its libraries, faulted in as code paths first run,
    and given back under memory pressure); ``shmem``, shared memory (Ray's object store pages it touched). A kind
    /proc does not report is left out."""
    parts: Dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] in RSS_PARTS:
                parts[RSS_PARTS[fields[0]]] = float(fields[1])
    return parts


def logged_rounds(metrics: Path) -> int:
    """Lines of ``metrics.jsonl`` (one per round the driver logged); 0 before the file exists."""
    try:
        with open(metrics, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


class TreeSampler(threading.Thread):
    """Samples the RSS of ``root_pid``'s process tree every ``every_s`` seconds, summed per role (`role_of`) and
    over the whole tree (``"tree"``), from the run's first logged round until the last round starts (that round
    ends with the run's one checkpoint save, at the episode's end: a one-off, not growth per round; then the run
    tears down, and its actors ending is no memory given back by the run).

    samples: role -> [(round, KiB)]; ``"tree"`` holds the whole tree's sum; ``"<role>:anon"``, ``"<role>:file"`` and
    ``"<role>:shmem"`` the parts of a role's RSS by kind of page (`rss_parts_kib`), ``"tree:anon"`` the tree's
    private memory (the one kind no two processes share).
    """

    def __init__(self, root_pid: int, metrics: Path, last_round: int, every_s: float = 0.25):
        super().__init__(daemon=True)
        self.root_pid, self.metrics, self.every_s = root_pid, Path(metrics), every_s
        self.last_round = last_round
        self.samples: Dict[str, List[Tuple[int, float]]] = {role: [] for role in (*ROLES, "tree")}
        self.samples.update({f"{role}:{kind}": [] for role in ROLES for kind in RSS_PARTS.values()})
        self.samples["tree:anon"] = []
        self.stop = threading.Event()

    def _tree(self):
        import psutil

        root = psutil.Process(self.root_pid)
        return [root, *root.children(recursive=True)]

    def sample_once(self) -> Optional[Dict[str, float]]:
        """One look: role -> KiB (and ``"tree"``), or None before the first round is logged, once the last one runs
        (all rounds but it logged), or once the root is gone."""
        import psutil

        rounds = logged_rounds(self.metrics)
        if not 0 < rounds < self.last_round - 1:
            return None
        try:
            procs = self._tree()
        except psutil.NoSuchProcess:
            return None
        kib: Dict[str, float] = {}
        for proc in procs:
            try:
                role = role_of(proc.cmdline(), proc.pid, self.root_pid)
                rss = proc.memory_info().rss / KiB
                parts = rss_parts_kib(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, FileNotFoundError):
                continue
            kib[role] = kib.get(role, 0.0) + rss
            for kind, value in parts.items():
                kib[f"{role}:{kind}"] = kib.get(f"{role}:{kind}", 0.0) + value
        kib["tree"] = sum(v for k, v in kib.items() if ":" not in k)
        kib["tree:anon"] = sum(v for k, v in kib.items() if k.endswith(":anon"))
        for role, value in kib.items():
            self.samples[role].append((rounds, value))
        return kib

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample_once()


def slope_kib_per_round(points: Sequence[Tuple[int, float]], warm_up: float = WARM_UP_FRACTION) -> Optional[float]:
    """Least-squares slope (KiB per round) of ``points`` [(round, KiB)] whose round is past the first ``warm_up``
    share of the rounds seen; None with fewer than 10 such points or a single round."""
    if not points:
        return None
    last = max(r for r, _ in points)
    after = [(r, m) for r, m in points if r > warm_up * last]
    if len(after) < 10:
        return None
    n = len(after)
    mx = sum(r for r, _ in after) / n
    my = sum(m for _, m in after) / n
    var = sum((r - mx) ** 2 for r, _ in after)
    return sum((r - mx) * (m - my) for r, m in after) / var if var else None


def summarize(samples: Dict[str, List[Tuple[int, float]]], warm_up: float = WARM_UP_FRACTION) -> Dict[str, Any]:
    """role -> {"slope_kib_per_round", "mib_after_warm_up", "mib_end", "samples"} for the roles that were seen."""
    out: Dict[str, Any] = {}
    for role, points in samples.items():
        if not points:
            continue
        last = max(r for r, _ in points)
        after = [(r, m) for r, m in points if r > warm_up * last] or points
        slope = slope_kib_per_round(points, warm_up)
        out[role] = {"slope_kib_per_round": None if slope is None else round(slope, 3),
                     "mib_after_warm_up": round(after[0][1] / KiB, 1), "mib_end": round(points[-1][1] / KiB, 1),
                     "samples": len(points)}
    return out


def soak(placement: str, rounds: int, work_dir: Optional[Path] = None, every_s: float = 0.25,
         timeout_s: float = 3600, env: Optional[Dict[str, str]] = None, shape: str = "one_episode",
         keep_checkpoints: bool = False) -> Dict[str, Any]:
    """Runs ``rounds`` rounds of the toy GRPO soak in ``placement`` and ``shape`` (`SHAPES`) in a child process,
    sampling its tree. The run's checkpoints are removed at the end unless ``keep_checkpoints`` (the many-episode
    shape writes one per `EPISODE_ROUNDS` rounds, 4.5 MB each on the toy model).

    Returns {"placement", "shape", "rounds", "wall_s", "roles": `summarize`'s dict, "samples": role -> [(round,
    KiB)]}. Raises RuntimeError when the child fails (its output's tail in the message).
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"soak: placement must be one of {PLACEMENTS}, got {placement!r}")
    if shape not in SHAPES:
        raise ValueError(f"soak: shape must be one of {SHAPES}, got {shape!r}")
    if shape == "many_episodes" and rounds % EPISODE_ROUNDS:
        raise ValueError(f"soak: the many-episode shape runs episodes of {EPISODE_ROUNDS} rounds; rounds={rounds} "
                         f"is not a multiple of it")
    work_dir = Path(work_dir or tempfile.mkdtemp(prefix=f"soak-{placement}-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    run_dir = work_dir / "run"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--placement", placement,
           "--rounds", str(rounds), "--work-dir", str(work_dir), "--shape", shape]
    # One torch thread in the driver, as launch gives each actor on a 2-core host: on a shared host the colocated
    # run's spinning OpenMP threads slowed it 50-fold, which changes how long a soak takes, not what it holds.
    child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
                 **(env or {})}
    t0 = time.perf_counter()
    with open(work_dir / "child.log", "wb") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env)
        sampler = TreeSampler(child.pid, run_dir / "metrics.jsonl", rounds, every_s)
        sampler.start()
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            code = "timeout"
        finally:
            sampler.stop.set()
            sampler.join()
    wall_s = time.perf_counter() - t0
    if not keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    if code != 0:
        tail = (work_dir / "child.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"soak {placement}: the run's process ended with {code}; its output ends with:\n{tail}")
    done = logged_rounds(run_dir / "metrics.jsonl")
    if done != rounds:
        raise RuntimeError(f"soak {placement}: {done} rounds logged, {rounds} asked")
    return {"placement": placement, "shape": shape, "rounds": rounds, "wall_s": round(wall_s, 1),
            "roles": summarize(sampler.samples), "samples": sampler.samples}


def _child(placement: str, rounds: int, work_dir: Path, shape: str) -> None:
    """The run itself (in the child process): the toy model and data, then `launch_distributed`."""
    from coati_relay import launch_distributed
    from coati_relay.toy import build_tiny_model, write_toy_dataset

    model = str(build_tiny_model())
    episode_rounds = rounds if shape == "one_episode" else EPISODE_ROUNDS
    data = str(write_toy_dataset(work_dir / "toy.jsonl", num_prompts=PROMPTS_PER_ROUND * episode_rounds))
    result = launch_distributed(**soak_kwargs(model, data, str(work_dir / "run"), colocate=placement == "colocated",
                                              episodes=rounds // episode_rounds))
    log.info("soak %s: %d rounds, summary %s", placement, len(result.history), result.summary)


def format_report(reports: Sequence[Dict[str, Any]]) -> str:
    """A table: one line per placement and role, slope in KiB per round and RSS after the warm-up and at the end."""
    from coati_relay.observe.metrics import summary_table

    rows = [{"placement": r["placement"], "shape": r["shape"], "role": role,
             "KiB/round": s["slope_kib_per_round"],
             "MiB after warm-up": s["mib_after_warm_up"], "MiB at end": s["mib_end"]}
            for r in reports for role, s in r["roles"].items()]
    return summary_table(rows, ["placement", "shape", "role", "KiB/round", "MiB after warm-up", "MiB at end"])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--placement", choices=(*PLACEMENTS, "both"), default="both")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--shape", choices=SHAPES, default="one_episode")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="JSON report (with every sample)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.child:
        _child(args.placement, args.rounds, args.work_dir, args.shape)
        return
    placements = PLACEMENTS if args.placement == "both" else (args.placement,)
    reports = [soak(p, args.rounds, args.work_dir / p if args.work_dir else None, shape=args.shape)
               for p in placements]
    print(format_report(reports))
    if args.out:
        args.out.write_text(json.dumps(reports))


if __name__ == "__main__":
    main()
