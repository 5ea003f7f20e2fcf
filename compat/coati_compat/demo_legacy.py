"""The legacy ``coati.ray`` API on the toy task: ``ExperienceMakerHolder`` makers and ``DetachedPPOTrainer``
trainers, imported from their legacy paths and wired as the upstream examples wire them, so the run shows the
deprecation warnings a user of those scripts sees.

The reward model is a legacy-compatible module (``forward(sequences, attention_mask) -> [B]``) that decodes each
sequence and scores its response with ``coati_relay.rewards.get_reward_fn("toy_letter")``. The learning rate is
set with the shims' non-legacy ``actor_lr``/``critic_lr`` keywords (the legacy 1e-7 would not move a tiny model).
"""
from __future__ import annotations

import importlib
import logging
import math
import os
import re
import time
import uuid
import warnings
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

_PROMPT = re.compile(r"write the letter (\S) many times:(.*)", re.DOTALL)
# 24 prompt tokens hold the toy prompts whole (23 tokens): a cut prompt left the reward scoring the prompt's own
# letters, and an empty response became a trap the policy fell into in most seeds.
PROMPT_TOKENS, NEW_TOKENS, _TIMEOUT_S = 24, 12, 1800


def score_sequences(tokenizer: Any, sequences: torch.Tensor) -> torch.Tensor:
    """Toy-letter reward [B] of token sequences [B,S] made from the toy prompts (prompt text, then response)."""
    from coati_relay.parts import get_reward_fn

    responses, letters = [], []
    for text in tokenizer.batch_decode(sequences, skip_special_tokens=True):
        match = _PROMPT.search(text)
        letters.append(match.group(1) if match else None)
        responses.append(match.group(2) if match else text)
    return get_reward_fn("toy_letter")(responses, letters)


class ToyLetterRewardModel(nn.Module):
    """A legacy ``RewardModel`` stand-in: ``forward(sequences [B,S], attention_mask) -> rewards [B]``."""

    def __init__(self, model_path: str) -> None:
        super().__init__()
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    def forward(self, sequences: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return score_sequences(self.tokenizer, sequences.cpu()).to(sequences.device)


def _legacy(module: str) -> Any:
    return importlib.import_module(module)


def _metrics_callback(model_path: str, run_dir: str, batch_size: int) -> Any:
    """A ``TrainerCallback`` writing one metrics record per training step to ``run_dir/metrics.jsonl``."""
    base = _legacy("coati.ray.callbacks").TrainerCallback

    class LegacyRunMetrics(base):
        def __init__(self) -> None:
            self.step, self.tokenizer, self.log = 0, None, None
            self.batch_t0 = self.sync_t0 = self.sync_s = 0.0

        def on_batch_start(self) -> None:
            self.batch_t0 = time.perf_counter()

        def on_batch_end(self, metrics: Dict[str, float], experience: Any) -> None:
            from transformers import AutoTokenizer

            from coati_relay.parts import MetricsLogger

            if self.log is None:
                self.tokenizer, self.log = AutoTokenizer.from_pretrained(model_path), MetricsLogger(run_dir)
            self.step += 1
            reward = score_sequences(self.tokenizer, experience.sequences.cpu()).mean().item()
            self.log.log(self.step, {"reward": reward, "shaped_reward": experience.reward.mean().item(),
                                     "actor_loss": metrics["actor_loss"], "critic_loss": metrics["critic_loss"],
                                     "loss": metrics["actor_loss"], "weight_sync_s": self.sync_s,
                                     "samples_per_s": batch_size / max(1e-9, time.perf_counter() - self.batch_t0)})

        def on_update_start(self) -> None:
            self.sync_t0 = time.perf_counter()

        def on_update_end(self) -> None:
            self.sync_s = time.perf_counter() - self.sync_t0

    return LegacyRunMetrics()


def _policy_and_critic(model_path: str, seed: int) -> Any:
    """A legacy ``Actor`` and a legacy ``Critic`` (valued on the prompt, as in the reference version), fp32; seeds
    this actor's torch RNG (model init, then sampling and shuffling)."""
    from transformers import AutoModel, AutoModelForCausalLM

    base = _legacy("coati.models.base")
    torch.manual_seed(seed)
    actor = base.Actor(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32))
    body = AutoModel.from_pretrained(model_path, dtype=torch.float32)
    head = nn.Linear(body.config.hidden_size, 1)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)  # V = 0 at first: the first advantages are the rewards themselves
    return actor, base.Critic(body, head, use_action_mask=True)


def _maker_models(model_path: str, seed: int) -> Any:
    actor, critic = _policy_and_critic(model_path, seed)
    initial, _ = _policy_and_critic(model_path, seed)
    return (actor.requires_grad_(False), critic.requires_grad_(False), ToyLetterRewardModel(model_path),
            initial.requires_grad_(False))


def _prompt_loader(model_path: str, csv_path: str, batch_size: int) -> Any:
    import pandas as pd
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"

    def tokenize(texts: List[str]) -> Dict[str, torch.Tensor]:
        return dict(tokenizer(list(texts), return_tensors="pt", max_length=PROMPT_TOKENS, padding="max_length",
                              truncation=True))

    prompts = list(pd.read_csv(csv_path)["prompt"])
    prompts *= math.ceil(batch_size / len(prompts))  # every batch full, however few prompts the file has
    return DataLoader(prompts, batch_size=batch_size, shuffle=True, collate_fn=tokenize, drop_last=True)


def _env_infos(n: int, port: int) -> List[Dict[str, str]]:
    return [{"local_rank": "0", "rank": str(r), "world_size": str(n), "master_port": str(port),
             "master_addr": "127.0.0.1"} for r in range(n)]


def run_legacy_ppo(model_path: str, csv_path: str, run_dir: str, num_makers: int = 1, num_trainers: int = 1,
                   steps: int = 100, lr: float = 5e-3, batch_size: int = 16, kl_coef: float = 0.1,
                   seed: int = 0, sampler: Optional[str] = None) -> Dict[str, Any]:
    """Legacy-API PPO on the toy task: ``steps`` training steps of ``batch_size`` samples per trainer, a weight push
    after each (``update_steps=1``), the legacy ``kl_coef``; ``sampler`` is the makers' (None: the maker's default).
    Uses the running Ray session, or starts (and stops) one.

    Returns ``{"history": [{"step", "time", "reward", "shaped_reward", "actor_loss", "critic_loss", "loss",
    "weight_sync_s", "samples_per_s"}], "warnings": [FutureWarning messages], "wall_s": float}``; the history (of the
    rank-0 trainer) is also in ``run_dir/metrics.jsonl``. On two CPU cores the defaults take 30-45 s and raise the
    mean reward of the last 25 steps above 0.9 (0.94-1.00 in 5 seeds with vLLM makers, from 0.01-0.24 at first).
    """
    for name, value, low in (("num_makers", num_makers, 1), ("num_trainers", num_trainers, 1),
                             ("steps", steps, 1), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"run_legacy_ppo: {name} must be an int >= {low}, got {value!r}")
    from coati_relay.parts import is_positive

    if not is_positive(lr):
        raise ValueError(f"run_legacy_ppo: lr must be a positive number, got {lr!r}")
    if isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float)):
        raise ValueError(f"run_legacy_ppo: kl_coef must be a number, got {kl_coef!r}")
    for path in (model_path, csv_path):
        if not os.path.exists(path):
            raise ValueError(f"run_legacy_ppo: {path} does not exist")
    import ray

    from coati_relay.parts import free_port, read_metrics, start_local_ray

    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").unlink(missing_ok=True)
    t0 = time.perf_counter()
    started_ray = not ray.is_initialized()
    if started_ray:
        start_local_ray(namespace="coati-relay-legacy-demo")
    namespace = ray.get_runtime_context().namespace
    tag = uuid.uuid4().hex[:6]
    options = {"num_gpus": 1, "max_concurrency": 2, "runtime_env": {"env_vars": {"RAY_NAMESPACE": namespace}}}
    previous_namespace = os.environ.get("RAY_NAMESPACE")
    os.environ["RAY_NAMESPACE"] = namespace
    actors: List[Any] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FutureWarning)
            ppo = _legacy("coati.ray.detached_trainer_ppo")
            holder = _legacy("coati.ray.experience_maker_holder")
            utils = _legacy("coati.ray.utils")
            makers = [f"legacy_maker{i}_{tag}" for i in range(num_makers)]
            trainers = [f"legacy_trainer{i}_{tag}" for i in range(num_trainers)]
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
            maker_envs, trainer_envs = _env_infos(num_makers, free_port()), _env_infos(num_trainers, free_port())
            for i, name in enumerate(makers):
                targets = utils.get_receivers_per_sender(i, num_makers, num_trainers, allow_idle_sender=False)
                actors.append(holder.ExperienceMakerHolder.options(name=name, **options).remote(
                    detached_trainer_name_list=[trainers[t] for t in targets],
                    strategy_fn=partial(utils.get_strategy_from_args, "naive"),
                    model_fn=partial(_maker_models, model_path, seed + i), env_info=maker_envs[i], kl_coef=kl_coef,
                    max_length=PROMPT_TOKENS + NEW_TOKENS, do_sample=True, temperature=1.0, top_k=50,
                    pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, sampler=sampler))
            trainer_strategy = "naive" if num_trainers == 1 else "ddp"
            for i, name in enumerate(trainers):
                targets = utils.get_receivers_per_sender(i, num_trainers, num_makers, allow_idle_sender=True)
                callbacks = [_metrics_callback(model_path, str(run), batch_size)] if i == 0 else []
                actors.append(ppo.DetachedPPOTrainer.options(name=name, **options).remote(
                    experience_maker_holder_name_list=[makers[m] for m in targets],
                    strategy_fn=partial(utils.get_strategy_from_args, trainer_strategy),
                    model_fn=partial(_policy_and_critic, model_path, seed), env_info=trainer_envs[i],
                    train_batch_size=batch_size, buffer_limit=2, callbacks=callbacks, actor_lr=lr, critic_lr=lr))
        maker_steps = math.ceil(steps * num_trainers / num_makers)
        loops = [m.workingloop.remote(partial(_prompt_loader, model_path, csv_path, batch_size), num_steps=maker_steps)
                 for m in actors[:num_makers]]
        fits = [t.fit.remote(steps, 1, 1) for t in actors[num_makers:]]
        ray.get(loops + fits, timeout=_TIMEOUT_S)  # a maker's error first: it explains a starved trainer
    finally:
        for actor in actors:
            ray.kill(actor)
        if previous_namespace is None:
            os.environ.pop("RAY_NAMESPACE", None)
        else:
            os.environ["RAY_NAMESPACE"] = previous_namespace
        if started_ray:
            ray.shutdown()
    shown = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    return {"history": read_metrics(run), "warnings": list(dict.fromkeys(shown)),
            "wall_s": time.perf_counter() - t0}


def demo_row(model_path: str, out_dir: Path, steps: int = 100) -> Dict[str, Any]:
    """The legacy row of ``coati-relay demo`` (entry point ``coati_relay.demo_rows``): `run_legacy_ppo` on the demo's
    model and prompts, printing the deprecation warnings a user of the legacy API sees.

    Legacy PPO makes one response per prompt and trains on 16 of them per step, so it takes more (cheaper) steps than
    the engine's rows."""
    from coati_relay.parts import run_summary, write_toy_dataset

    out = Path(out_dir)
    csv = str(write_toy_dataset(out / "prompts.csv", num_prompts=8, fmt="csv"))
    print(f"[demo] legacy coati.ray PPO (ExperienceMakerHolder + DetachedPPOTrainer), {steps} steps")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        result = run_legacy_ppo(model_path=model_path, csv_path=csv, run_dir=str(out / "legacy"), steps=steps)
    shown = result.get("warnings") or [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    for text in dict.fromkeys(shown):
        print(f"  FutureWarning: {text.splitlines()[0]}")
    return {"run": "PPO (legacy API)", **run_summary(result["history"]), "run_dir": str(out / "legacy")}
