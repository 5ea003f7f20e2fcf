"""`coati-relay demo`: a tiny model learns the toy task with GRPO and PPO through `launch_distributed`, then the
legacy `coati.ray` API runs PPO on the same task.

The engine runs colocated by default (``colocate=True``: producer and consumer in this process, generating with the
training model itself, or with ``--backend vllm`` an in-process vLLM engine; the README's "Using the engine" gives
the measurements behind that choice); ``--mode disaggregated`` runs a vLLM (or ``--backend transformers``) producer
and a ColossalAI consumer as Ray actors.

Everything is built locally: the model and tokenizer (cached after the first run) and the prompts.
"""
from __future__ import annotations

import logging
import shutil
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Dict, List, Optional

log = logging.getLogger(__name__)
# Rows other packages add to the demo's table: ``coati_compat`` registers the legacy API's PPO run here. An entry is
# ``row(model_path: str, out_dir: Path) -> {"run": str, "run_dir": str, **run_summary}``.
DEMO_ROWS_GROUP = "coati_relay.demo_rows"
PROMPTS_PER_ROUND = 8


def _engine_kwargs(model: str, data: str, run_dir: Path, algo: str, rounds: int, backend: str,
                   colocate: bool) -> Dict[str, Any]:
    """Settings that make the reward rise within a minute or two on two CPU cores: one episode of ``rounds``
    rounds over `PROMPTS_PER_ROUND` * rounds prompts, so that ColossalChat's learning-rate cosine spans the run and
    its one checkpoint is the episode's end."""
    group = 8 if algo != "PPO" else 4
    prompts_per_round = PROMPTS_PER_ROUND
    return dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=prompts_per_round, inference_microbatch_size=prompts_per_round,
        train_batch_size=prompts_per_round, train_minibatch_size=prompts_per_round,
        train_dataset_config={"path": data, "max_length": 32, "system_prompt": ""},
        inference_model_config={"path": model},
        generate_config={"max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0}, seed=0,
        train_model_config={"path": model},
        grpo_config={"lr": 5e-3, "critic_lr": 5e-3, "beta": 0.0, "kl_coef": 0.0, "reward_fn_type": "toy_letter",
                     "train_microbatch_size": 32},
        plugin_config={"plugin": "ddp"},
        inference_backend=backend, num_generations=group, core_algo=algo,
        project_name=f"demo-{algo.lower()}", run_dir=str(run_dir), save_interval=10_000, colocate=colocate,
    )


def run_demo(out_dir: str = "runs/demo", rounds: int = 20, backend: Optional[str] = None, legacy: bool = True,
             seed: int = 0, colocate: bool = True) -> Dict[str, Any]:
    """Runs GRPO, PPO and (optionally) the legacy PPO shims; prints a table; returns the summaries.

    backend: the producer's inference backend (None: transformers colocated, vLLM disaggregated)."""
    backend = backend or ("transformers" if colocate else "vllm")

    from coati_relay.launch import launch_distributed
    from coati_relay.observe.metrics import summary_table
    from coati_relay.observe.plotting import plot_run
    from coati_relay.toy import build_tiny_model, write_toy_dataset

    t0 = time.perf_counter()
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model = str(build_tiny_model(seed=seed))
    data = str(write_toy_dataset(out / "prompts.jsonl", num_prompts=PROMPTS_PER_ROUND * rounds))
    print(f"[demo] tiny model: {model}\n[demo] prompts:    {data}")
    if not colocate or legacy:
        import ray

        from coati_relay.cluster.local_ray import start_local_ray

        if not ray.is_initialized():
            start_local_ray(num_cpus=4)
    rows: List[Dict[str, Any]] = []
    run_dirs = []
    for algo in ("GRPO", "PPO"):
        run_dir = out / algo.lower()
        where = "colocated in this process" if colocate else "as Ray actors"
        print(f"[demo] {algo}: 1 {backend} producer, 1 ColossalAI consumer, {where}, {rounds} steps")
        result = launch_distributed(**_engine_kwargs(model, data, run_dir, algo, rounds, backend, colocate))
        rows.append({"run": f"{algo} (new API)", **result.summary})
        run_dirs.append(run_dir)
    if legacy:
        added = [entry.load()(model, out) for entry in entry_points(group=DEMO_ROWS_GROUP)]
        if not added:
            print("[demo] the legacy row needs coati_compat (the compat/ package), which is not installed: skipped")
        rows += added
        run_dirs += [Path(row["run_dir"]) for row in added]
    print()
    print(summary_table(rows, ["run", "steps", "samples_per_s", "reward_start", "reward_end",
                               "weight_sync_s_per_step", "wall_s"]))
    png = plot_run([str(d) for d in run_dirs], out_png=str(out / "reward_loss.png"))
    print(f"\n[demo] plot: {png}\n[demo] total {time.perf_counter() - t0:.0f}s")
    return {"rows": rows, "plot": str(png), "wall_s": time.perf_counter() - t0}


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="coati-relay demo", description=__doc__)
    p.add_argument("--out", default="runs/demo", help="directory of the runs and their plots (default runs/demo)")
    p.add_argument("--steps", type=int, default=20, help="steps (weight versions) of each run (default 20)")
    p.add_argument("--mode", default="colocated", choices=["colocated", "disaggregated"],
                   help="colocated: producer and consumer in this process (default); disaggregated: Ray actors")
    p.add_argument("--backend", default=None, choices=["vllm", "transformers"],
                   help="the producer's backend (default: transformers colocated, vllm disaggregated)")
    p.add_argument("--no-legacy", action="store_true", help="leave out the legacy coati.ray PPO run")
    a = p.parse_args(argv)
    run_demo(a.out, a.steps, a.backend, legacy=not a.no_legacy, colocate=a.mode == "colocated")
    return 0
