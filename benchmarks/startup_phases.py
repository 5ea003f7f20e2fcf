"""Start-up of one side of the TRL pair (`peer_grpo.py`), phase by phase, in a fresh process:

    python benchmarks/startup_phases.py {trl|engine} --model DIR --out RESULT.json [--backend vllm|transformers]
        [--new-tokens N] [--engine JSON]

Each phase is timed in the order a run meets it, so an import counts only what the phases before it did not load:

- both sides: ``torch`` (the interpreter's own start is ``python_s``, from the process's creation to this script),
  ``transformers`` (with ``AutoModelForCausalLM``);
- TRL: ``trl`` (``GRPOTrainer``, with ``datasets``), then ``trainer`` (the model loaded and ``GRPOTrainer`` built);
- engine (the colocated placement's set-up, `coati_relay.roles.colocated`): ``coati_relay`` (the driver's config
  modules), ``colossalai`` (``Booster`` and its DDP plugin), ``config`` (`build_run_config`: the checks before
  anything starts), ``consumer`` (the policy loaded and boosted, ``ConsumerWorker.setup_colocated``), and with vLLM
  ``vllm`` (its import) and ``engine`` (the producer's set-up: the vLLM engine started, its compilation
  ``compile_s`` and KV cache ``kv_cache_bytes`` recorded), or with transformers ``producer`` (the backend around
  the policy).

The result also holds ``rss_mib`` (this process's resident memory after start-up, before the engine is closed),
``rss_after_mib`` (the same after each phase) and the 1-minute ``load_average``. ``--engine`` passes extra
``inference_model_config`` keys (``{"enforce_eager": true}``, ``{"kv_cache_memory_bytes": 1073741824}``), to time
one setting against another back to back.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve().parent


class Phases:
    """Seconds of each named phase, in order, and this process's resident memory after it."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self.rss_after_mib: Dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        value = fn()
        self.seconds[name] = time.perf_counter() - t0
        self.rss_after_mib[name] = _rss_mib()
        return value


def _since_process_start() -> float:
    """Seconds since this process was created (the interpreter's start and its site imports)."""
    import psutil

    return time.time() - psutil.Process().create_time()


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2 ** 20


def trl_startup(p: Phases, model: str, work_dir: Path, new_tokens: int) -> None:
    import peer_grpo

    p.run("trl", lambda: (__import__("datasets"), __import__("trl").GRPOTrainer))

    def trainer() -> Any:
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer

        rows = [json.loads(line) for line in open(peer_grpo._prompts(work_dir / "prompts.jsonl", 1))]
        data = Dataset.from_list([{"prompt": [r["messages"]]} for r in rows])
        config = GRPOConfig(output_dir=str(work_dir / "trl"), use_cpu=True, max_steps=1, beta=0.0,
                            num_generations=peer_grpo.GENERATIONS, max_completion_length=new_tokens,
                            per_device_train_batch_size=peer_grpo.PROMPTS_PER_STEP * peer_grpo.GENERATIONS,
                            report_to="none", save_strategy="no", disable_tqdm=True)
        return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
                           reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                           train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model))

    p.run("trainer", trainer)


def engine_startup(p: Phases, model: str, work_dir: Path, backend: str, new_tokens: int,
                   engine: Dict[str, Any]) -> Dict[str, Any]:
    import peer_grpo

    p.run("coati_relay", lambda: __import__("coati_relay.launch"))

    def colossalai() -> None:
        from colossalai.booster import Booster  # noqa: F401
        from colossalai.booster.plugin import TorchDDPPlugin  # noqa: F401

    p.run("colossalai", colossalai)
    from coati_relay.assembly.build import build_run_config
    from coati_relay.roles.consumer import ConsumerWorker
    from coati_relay.roles.producer import ProducerWorker

    cfg = p.run("config", lambda: build_run_config(**peer_grpo.engine_kwargs(
        model, 1, work_dir, backend, True, new_tokens, engine)))
    consumer = ConsumerWorker(0, cfg, queue=None, weight_store=None)
    policy = p.run("consumer", consumer.setup_colocated)
    producer = ProducerWorker(0, cfg, queue=None, weight_store=None)
    if backend == "transformers":
        p.run("producer", lambda: producer.setup_colocated(policy))
        return {}
    p.run("vllm", lambda: __import__("vllm").LLM)  # vllm imports lazily: LLM loads the engine
    p.run("engine", lambda: producer.setup_colocated(policy))
    llm_config = producer.backend.llm.llm_engine.vllm_config
    out = {"engine_start_s": producer.backend.start_seconds,
           "compile_s": float(getattr(llm_config.compilation_config, "compilation_time", 0.0) or 0.0),
           "kv_cache_bytes": llm_config.cache_config.kv_cache_memory_bytes, "rss_mib": _rss_mib()}
    producer.backend_close()
    return out


def main(argv: List[str]) -> int:
    python_s = _since_process_start()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("side", choices=["trl", "engine"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--engine", default="{}", help="extra inference_model_config keys, as JSON")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    work_dir = Path(a.out).with_suffix("")
    work_dir.mkdir(parents=True, exist_ok=True)
    p = Phases()
    p.run("torch", lambda: __import__("torch"))
    p.run("transformers", lambda: __import__("transformers").AutoModelForCausalLM)
    extra: Dict[str, Any] = {}
    if a.side == "trl":
        trl_startup(p, a.model, work_dir, a.new_tokens)
    else:
        extra = engine_startup(p, a.model, work_dir, a.backend, a.new_tokens, json.loads(a.engine))
    result = {"side": a.side if a.side == "trl" else f"engine-colocated-{a.backend}", "engine": json.loads(a.engine),
              "python_s": python_s, "phases_s": p.seconds, "rss_after_mib": p.rss_after_mib,
              "total_s": python_s + sum(p.seconds.values()), "rss_mib": _rss_mib(),
              "load_average": os.getloadavg()[0], **extra}
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
