"""One side of the TRL pair (`test_vs_trl.py`), run as its own process so that its start-up and memory are its own:

    python benchmarks/peer_grpo.py {trl|engine} --model DIR --steps N --out RESULT.json [--backend vllm|transformers]
        [--colocate] [--new-tokens N] [--engine JSON] [--train-microbatch N] [--prompts N] [--generations N]
        [--precision bf16|fp32]

Both sides do the same GRPO work: the toy prompts (`coati_relay.toy`, numbered, chat template applied),
``--prompts`` (default ``PROMPTS_PER_STEP``) prompts x ``--generations`` (default ``GENERATIONS``) samples of at most
``--new-tokens`` (default ``NEW_TOKENS``) tokens per step, the ``toy_letter`` reward, AdamW at ``LR`` with weight
decay 0.01, a constant schedule, no gradient clipping, sample-level loss, ``beta = 0``, one optimizer step per
generation round, training in ``--precision`` (default bf16, TRL's default: float32 weights and optimizer state,
forwards under bf16 autocast; TRL's ``bf16``, the engine's ``ddp`` plugin ``precision``). The result file holds, per
step, the wall time, the time spent generating, the time spent training (TRL: the step less generation and scoring, with
``loss_s``, its loss forwards, and ``score_s``, its reward calls; the engine: the consumer's ``train_s``, and
``publish_s``, its weight hand-off), the mean reward, the number of sampled tokens and the number of samples (TRL: the
rows it generated and the rows its loss took; the engine: the rows the consumer trained on). The engine's colocated side
also holds ``memory_by_phase_mib``: its process's largest RSS in each phase (`memory_by_phase`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

PROMPTS_PER_STEP = 8
GENERATIONS = 8
NEW_TOKENS = 12
LR = 5e-3
SEED = 0


def numbered_prompt(text: str, i: int) -> str:
    """Prompt ``i`` of a run: the toy text and its number."""
    return f"{text} {i}"


def _prompts(path: Path, steps: int, prompts: int = PROMPTS_PER_STEP) -> Path:
    """The toy prompts, numbered so that no two are equal: the toy task has one prompt text, and equal prompts in
    one step would let the engine's prompt sharing compute a single prompt where real data has one per group."""
    from coati_relay.toy import write_toy_dataset

    rows = [json.loads(line) for line in open(write_toy_dataset(path, num_prompts=prompts * steps))]
    for i, row in enumerate(rows):
        row["messages"]["content"] = numbered_prompt(row["messages"]["content"], i)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def trl_device_kwargs(cuda: bool) -> Dict[str, Any]:
    """The device keywords of TRL's ``GRPOConfig``: the GPU where there is one (``use_cpu=False``), in TRL's default
    precision (bf16 mixed precision unless fp16 is set: left as it is), else the CPU. Before, TRL ran on the CPU on
    every host, and a GPU pair compared a GPU engine with a CPU TRL."""
    return {"use_cpu": not cuda}


def run_trl(model: str, steps: int, work_dir: Path, new_tokens: int, prompts: int = PROMPTS_PER_STEP,
            generations: int = GENERATIONS, microbatch: Optional[int] = None,
            precision: str = "bf16") -> Dict[str, Any]:
    """TRL's ``GRPOTrainer`` on the GPU where there is one (else the CPU), generating with ``model.generate`` (TRL's
    own default without vLLM). microbatch: samples per training forward and backward (``per_device_train_batch_size``,
    with ``gradient_accumulation_steps`` making up the step's samples: still one generation batch and one optimizer
    step a step); None: all of a step's samples in one. precision: ``"bf16"`` (``GRPOConfig``'s default
    ``bf16=True``: autocast) or ``"fp32"``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from coati_relay.rewards.toy_rewards import letter_fraction

    rows = [json.loads(line) for line in open(_prompts(work_dir / "prompts.jsonl", steps, prompts))]
    data = Dataset.from_list([{"prompt": [r["messages"]], "gt_answer": r["gt_answer"]} for r in rows])

    steps_out: List[Dict[str, float]] = []
    gen = {"s": 0.0, "tokens": 0, "rows": 0, "trained_rows": 0, "score_s": 0.0, "loss_s": 0.0}

    def toy_letter(completions: List[Any], gt_answer: List[str], **_: Any) -> List[float]:
        t0 = time.perf_counter()
        out = [letter_fraction(c[0]["content"] if isinstance(c, list) else c, gt) for c, gt in zip(completions,
                                                                                                 gt_answer)]
        gen["score_s"] += time.perf_counter() - t0
        return out

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            gen.update(s=0.0, tokens=0, rows=0, trained_rows=0, score_s=0.0, loss_s=0.0)

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - self.t0
            steps_out.append({"step_s": step_s, "generate_s": gen["s"], "score_s": gen["score_s"],
                              "loss_s": gen["loss_s"], "train_s": step_s - gen["s"] - gen["score_s"],
                              "tokens": gen["tokens"], "samples": gen["rows"], "trained_samples": gen["trained_rows"]})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps_out:
                steps_out[-1]["reward"] = float(logs["reward"])

    microbatch = microbatch or prompts * generations
    if (prompts * generations) % microbatch:
        raise ValueError(f"--train-microbatch {microbatch} must divide the step's {prompts * generations} samples")
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model)
    generate = policy.generate

    def timed_generate(*args: Any, **kwargs: Any):
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        gen["s"] += time.perf_counter() - t0
        prompt_len = (kwargs.get("input_ids") if "input_ids" in kwargs else args[0]).size(1)
        gen["tokens"] += int(out[:, prompt_len:].ne(tokenizer.pad_token_id).sum())
        gen["rows"] += out.size(0)
        return out

    policy.generate = timed_generate
    config = GRPOConfig(
        output_dir=str(work_dir / "trl"), **trl_device_kwargs(torch.cuda.is_available()), seed=SEED,
        max_steps=steps, learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=0.0,
        beta=0.0, loss_type="grpo", **({} if precision == "bf16" else {"bf16": False}),  # bf16: TRL's default
        num_generations=generations, per_device_train_batch_size=microbatch,
        gradient_accumulation_steps=prompts * generations // microbatch,
        max_completion_length=new_tokens, temperature=1.0, top_p=1.0, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=policy, reward_funcs=toy_letter, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[StepClock()])
    compute_loss = trainer.compute_loss

    def counted_compute_loss(model: Any, inputs: Dict[str, Any], *args: Any, **kwargs: Any):
        gen["trained_rows"] += inputs["completion_ids"].size(0)
        t0 = time.perf_counter()
        loss = compute_loss(model, inputs, *args, **kwargs)
        gen["loss_s"] += time.perf_counter() - t0
        return loss

    trainer.compute_loss = counted_compute_loss
    trainer.train()
    return {"side": "trl", "steps": steps_out, "params": _moved_and_finite(model, trainer.model)}


def engine_kwargs(model: str, steps: int, work_dir: Path, backend: str, colocate: bool, new_tokens: int,
                  engine: Optional[Dict[str, Any]] = None, microbatch: Optional[int] = None,
                  gradient_checkpointing: bool = False, prompts: int = PROMPTS_PER_STEP,
                  generations: int = GENERATIONS, precision: str = "bf16") -> Dict[str, Any]:
    """The `launch_distributed` keywords of the engine side. engine: extra ``inference_model_config`` keys;
    microbatch: samples per training forward and backward (None: all of a round's; one optimizer step per round
    either way); gradient_checkpointing: ``train_model_config``'s setting; precision: the ``ddp`` plugin's."""
    return dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=prompts, inference_microbatch_size=prompts,
        train_batch_size=prompts, train_minibatch_size=prompts,
        train_dataset_config={"prompts": [json.loads(line) for line in open(_prompts(work_dir / "prompts.jsonl",
                                                                                        steps, prompts))],
                              "max_length": 64},
        inference_model_config={"path": model, **(engine or {})},
        train_model_config={"path": model, "gradient_checkpointing": gradient_checkpointing},
        generate_config={"max_new_tokens": new_tokens, "temperature": 1.0, "top_p": 1.0}, seed=SEED,
        grpo_config={"lr": LR, "beta": 0.0, "weight_decay": 0.01, "reward_fn_type": "toy_letter",
                     "train_microbatch_size": microbatch or prompts * generations},
        plugin_config={"plugin": "ddp", "precision": precision}, inference_backend=backend, num_generations=generations,
        core_algo="GRPO", project_name="vs-trl", run_dir=str(work_dir / "engine"), save_interval=10_000,
        colocate=colocate)


def run_engine(model: str, steps: int, work_dir: Path, backend: str, colocate: bool, new_tokens: int,
               engine: Optional[Dict[str, Any]] = None, microbatch: Optional[int] = None,
               gradient_checkpointing: bool = False, prompts: int = PROMPTS_PER_STEP,
               generations: int = GENERATIONS, precision: str = "bf16") -> Dict[str, Any]:
    """`launch_distributed(core_algo="GRPO")`: one producer, one consumer; disaggregated on a local Ray cluster of
    its own, or colocated in this process (no Ray). engine: extra ``inference_model_config`` keys."""
    from coati_relay.launch import launch_distributed

    if not colocate:
        import ray

        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    rss = RssTimeline().start()
    try:
        result = launch_distributed(**engine_kwargs(model, steps, work_dir, backend, colocate, new_tokens, engine,
                                                    microbatch, gradient_checkpointing, prompts, generations,
                                                    precision))
    finally:
        rss.stop()
        if not colocate:
            ray.shutdown()
    out = [{"step_s": h["round_s"], "generate_s": h.get("generate_s", 0.0), "train_s": h.get("train_s", 0.0),
            "publish_s": h.get("weight_sync_s", 0.0), "reward": h["reward"],
            "tokens": h.get("response_length", 0.0) * h["samples"], "samples": h["samples"]} for h in result.history]
    ckpt = result.checkpoints[-1] if result.checkpoints else None
    side = f"engine-{'colocated-' if colocate else ''}{backend}"
    phases = {"memory_by_phase_mib": memory_by_phase(rss.samples, result.history)} if colocate else {}
    return {"side": side, "steps": out, "params": _moved_and_finite(model, ckpt), **phases}


class RssTimeline:
    """This process's RSS (MiB) every ``every_s`` seconds, as ``(time.time(), MiB)`` in ``samples``, from `start` to
    `stop`."""

    def __init__(self, every_s: float = 0.1) -> None:
        import threading

        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-timeline")

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            with open("/proc/self/statm") as f:
                self.samples.append((time.time(), int(f.read().split()[1]) * page / 2 ** 20))
            self._stop.wait(self.every_s)

    def start(self) -> "RssTimeline":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def memory_by_phase(samples: List[Any], history: List[Dict[str, Any]]) -> Dict[str, float]:
    """The largest RSS (MiB) of ``samples`` (`RssTimeline`) in each phase of a colocated run, read from its round
    records: ``set-up`` (before the first round), ``generate`` (each round until training: generation, scoring),
    ``train`` (the consumer's step), ``publish`` (after the step to the round's end: the weight hand-off, a
    checkpoint), ``end`` (after the last round: the final checkpoint and the export)."""
    spans = []
    for h in history:
        end = h["train_started_at"] - h["wait_s"] + h["round_s"]
        spans += [("generate", h["train_started_at"] - h["wait_s"], h["train_started_at"]),
                  ("train", h["train_started_at"], h["train_ended_at"]), ("publish", h["train_ended_at"], end)]
    first, last = (spans[0][1], spans[-1][2]) if spans else (float("inf"), float("inf"))
    peaks: Dict[str, float] = {}
    for t, mib in samples:
        phase = "set-up" if t < first else "end" if t >= last else next(
            (name for name, a, b in spans if a <= t < b), "between rounds")
        peaks[phase] = max(peaks.get(phase, 0.0), mib)
    return peaks


def _moved_and_finite(initial: str, trained: Any) -> Dict[str, Any]:
    """How many parameters moved from the initial checkpoint and whether all are finite (``trained``: a model, on any
    device, whose devices are recorded as ``devices``, or a checkpoint directory the engine wrote, holding
    ``policy/model.pt``; None when the run saved nothing). Compared on the CPU in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    if trained is None:
        return {"checked": False}
    before = AutoModelForCausalLM.from_pretrained(initial, dtype=torch.float32).state_dict()
    where = {}
    if isinstance(trained, torch.nn.Module):
        where = {"devices": sorted({str(p.device) for p in trained.parameters()})}  # where the side trained it
        after = {k: v.detach().to("cpu", torch.float32) for k, v in trained.state_dict().items()}
    else:
        after = torch.load(Path(trained) / "policy" / "model.pt", map_location="cpu")
    shared = [k for k in before if k in after]
    return {"checked": True, "tensors": len(shared), **where,
            "moved": sum(not torch.equal(before[k], after[k].float()) for k in shared),
            "finite": all(bool(torch.isfinite(after[k]).all()) for k in shared)}


def gpu_peak() -> Dict[str, float]:
    """On CUDA, ``gpu_peak_gib``: the most GPU memory this process's tensors held at once
    (``torch.cuda.max_memory_allocated``; the whole of TRL and of a colocated run, the driver alone of a run with
    actors); nothing elsewhere."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"gpu_peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30}


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("side", choices=["trl", "engine"])
    p.add_argument("--model", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    p.add_argument("--colocate", action="store_true", help="the engine side: producer and consumer in one process")
    p.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="most tokens sampled per response")
    p.add_argument("--train-microbatch", type=int, default=None,
                   help="samples per training forward and backward, on either side (default: all of a step's in "
                        "one; TRL's side with gradient checkpointing, its GRPOConfig default)")
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="the engine side: train_model_config['gradient_checkpointing'] (TRL's side has it on)")
    p.add_argument("--engine", default="{}", help="the engine side: extra inference_model_config keys, as JSON "
                                                   "(e.g. '{\"enforce_eager\": true}')")
    p.add_argument("--prompts", type=int, default=PROMPTS_PER_STEP, help="prompts per step")
    p.add_argument("--generations", type=int, default=GENERATIONS, help="samples per prompt")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"],
                   help="training precision of either side (bf16: float32 weights, forwards under bf16 autocast)")
    a = p.parse_args(argv)
    work_dir = Path(a.out).with_suffix("")
    work_dir.mkdir(parents=True, exist_ok=True)
    if a.side == "trl":
        result = run_trl(a.model, a.steps, work_dir, a.new_tokens, a.prompts, a.generations, a.train_microbatch,
                         a.precision)
    else:
        result = run_engine(a.model, a.steps, work_dir, a.backend, a.colocate, a.new_tokens, json.loads(a.engine),
                            a.train_microbatch, a.gradient_checkpointing, a.prompts, a.generations, a.precision)
    result["pid"] = os.getpid()
    result.update(gpu_peak())
    Path(a.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
