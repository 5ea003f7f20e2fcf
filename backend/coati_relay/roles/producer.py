"""The producer role: claim a task (a micro-batch of prompts), generate, score, hand the rollout to the queue.

Task ``t`` belongs to round ``t // tasks_per_round``; a round is what consumers train on between two weight
versions. A producer generates round ``r`` only with weights of version ``>= r - n_behind`` (0: lock-step,
on-policy) and always loads the newest version it sees.

Zero-bubble (`coati_relay.launch_zero_bubble`, ``cfg.zero_bubble``): a producer claims a task only while the
queue's data buffer has room (`RolloutQueueActor.wait_room`), never waits for weights (unless ``n_behind`` is an
int), and after each inference batch of its own (``inference_batch_size`` prompts) loads the newest version
published, if it is newer than the one it holds.

Idle time, in ``stats`` (seconds): ``wait_s`` waiting for weights, ``room_wait_s`` waiting for room in the queue
(zero-bubble's buffer, and a lock-step queue's put while full), ``claim_idle_s`` with no task free to claim.
``task_log`` (`coati_relay.observe.task_log.TaskLog`) holds ``(task, weight version, start, end)`` of its last 10,000
tasks (``time.time()``).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from coati_relay.cluster.heap import trim_heap
from coati_relay.cluster.placement import node_id
from coati_relay.cluster.waiting import call
from coati_relay.config.schema import RunConfig
from coati_relay.exchange.publishing import WeightSubscriber
from coati_relay.exchange.queue import pack_payload
from coati_relay.observe.profiling import PhaseProfiler
from coati_relay.observe.task_log import TaskLog
from coati_relay.rollout import Rollout

log = logging.getLogger(__name__)

_POLL_S = 2.0  # how often a producer waiting for weights looks for tasks a dead producer left behind


class ProducerWorker:
    """One producer, run as a Ray actor: its rollouts go to the queue (small ones by value, others through the object
    store: `pack_payload`). In a colocated run (`coati_relay.roles.colocated.ColocatedRoles`) it lives in the
    driver's process, set up by `setup_colocated`: the queue and the weight store are in-process handles
    (`coati_relay.exchange.in_process`), the queue holds the rollouts themselves, and the queue runs `work_once`
    when the consumer asks for rollouts."""

    evaluator = None  # `coati_relay.observe.evaluation.Evaluator` when the run evaluates (set up in `setup`)
    rollout_log = None  # `coati_relay.observe.rollout_log.RolloutLog` on producer 0

    def __init__(self, index: int, cfg: RunConfig, queue, weight_store, start_version: int = 0):
        self.index = index
        self.name = f"producer-{index}"
        self.cfg = cfg
        self.queue = queue
        self.store = weight_store
        self.start_version = start_version
        self.last_load_s = 0.0
        self.stats: Dict[str, float] = {"tasks": 0, "samples": 0, "tokens": 0, "generate_s": 0.0,
                                        "weight_load_s": 0.0, "weight_loads": 0, "wait_s": 0.0,
                                        "room_wait_s": 0.0, "claim_idle_s": 0.0}
        self.task_log = TaskLog(capacity=10_000)
        # enable_profiling: phase timings per round (`coati_relay.observe.profiling`); opened in the actor
        self.profiler = PhaseProfiler(None, self.name, False)

    # -- set-up ----------------------------------------------------------------------------------------------
    def setup(self, weight_addr: str = "", weight_port: int = 0) -> Dict[str, Any]:
        self.profiler = PhaseProfiler(self.cfg.checkpointing.run_dir, self.name, self.cfg.enable_profiling)
        from coati_relay.exchange.sync_registry import weight_sync_spec

        cfg = self.cfg
        t0 = time.perf_counter()
        self._load_prompts()
        self.backend = self._build_backend()
        self._load_scoring(self.backend.device)
        self._setup_observers()
        base = None
        if cfg.models.lora:
            from coati_relay.training.booster_backend import load_causal_lm

            base = {k: v.detach().clone() for k, v in load_causal_lm(cfg.models.model_path).state_dict().items()}
        self.subscriber: WeightSubscriber = weight_sync_spec(cfg.roles.weight_sync).subscriber(
            self.store, addr=weight_addr, port=weight_port, rank=self.index + 1, members=cfg.roles.num_producers + 1,
            first_version=self.start_version, timeout_s=cfg.roles.timeout_s, base_weights=base)
        self._load_version(self.start_version, timeout_s=self.cfg.roles.timeout_s)
        return {"role": self.name, "node": node_id(), "setup_s": time.perf_counter() - t0,
                "backend": cfg.roles.inference_backend}

    def setup_colocated(self, policy: torch.nn.Module, reserve_bytes: int = 0) -> None:
        """Set-up in a colocated run, where the weight store is also the subscriber
        (`coati_relay.exchange.in_process.TrainedVersions`). A backend that ``generates_in_place`` (transformers)
        generates with ``policy`` (the consumer's unwrapped training model) in place, taking each trained version
        without tensors; any other (vLLM) is an engine in this process with its own copy of the checkpoint, which the
        consumer loads each trained version into (the weight sync's ``colocated_publisher``,
        `coati_relay.exchange.in_process.InProcessPublisher`). Such an engine starts last,
        after the reward model loaded, sized by its spec's ``fit_beside_trainer`` to what the trainer and the reward
        model left of the device, ``reserve_bytes`` kept for the trainer's first step."""
        from coati_relay.cluster.devices import accelerator_device
        from coati_relay.inference import backend_spec

        self.profiler = PhaseProfiler(self.cfg.checkpointing.run_dir, self.name, self.cfg.enable_profiling)
        cfg = self.cfg
        self._load_prompts()
        spec = backend_spec(cfg.roles.inference_backend)
        if spec.generates_in_place:
            # the config leaves only the spec's in_place_keys here (`coati_relay.assembly.colocate`)
            self.backend = spec.build_on_module(policy, cfg.models.model_path, cfg.sampling, None,
                                                tokenizer=self.tokenizer, seed=cfg.seed + self.index,
                                                **cfg.models.inference_model_kwargs)
            self._load_scoring(self.backend.device)
        else:
            self._load_scoring(accelerator_device())
            fit = spec.fit_beside_trainer
            kwargs = cfg.models.inference_model_kwargs
            self.backend = self._build_backend(kwargs if fit is None else fit(kwargs, reserve_bytes))
        self.backend.weight_version = self.start_version
        self.subscriber = self.store
        self._setup_observers()

    def _build_backend(self, engine_kwargs: Optional[Dict[str, Any]] = None):
        """The configured inference backend with its own copy of the checkpoint, sized to the run where its spec has a
        ``run_sizing`` (vLLM: max_model_len and the CPU KV cache). engine_kwargs: its keywords (default: the
        config's ``inference_model_kwargs``)."""
        from coati_relay.inference import backend_spec, build_inference_backend

        cfg = self.cfg
        run_sizing = backend_spec(cfg.roles.inference_backend).run_sizing
        sized = {} if run_sizing is None else run_sizing(
            cfg.batches.inference_microbatch_size * cfg.batches.num_generations, cfg.data.max_prompt_tokens)
        kwargs = cfg.models.inference_model_kwargs if engine_kwargs is None else engine_kwargs
        return build_inference_backend(cfg.roles.inference_backend, cfg.models.model_path, cfg.sampling,
                                       tokenizer=self.tokenizer, seed=cfg.seed + self.index, **sized, **kwargs)

    def _load_prompts(self) -> None:
        from transformers import AutoTokenizer

        from coati_relay.prompts import PromptSampler, load_prompts

        cfg = self.cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.models.tokenizer_path, **cfg.models.tokenizer_kwargs)
        self.tokenizer.padding_side = "left"
        self.dataset = load_prompts(cfg.data.dataset, self.tokenizer, max_prompt_tokens=cfg.data.max_prompt_tokens,
                                    system_prompt=cfg.data.system_prompt)
        self.sampler = PromptSampler(len(self.dataset), cfg.batches.inference_microbatch_size, seed=cfg.seed)

    def _load_scoring(self, device: torch.device) -> None:
        """The reward model (on ``device``, the backend's), ColossalChat's rule reward or the registered/callable
        one."""
        cfg = self.cfg
        self.device = device
        self.reward_fn = self.rm_scorer = self.rule_reward = None
        if cfg.models.reward_model_path:
            from coati_relay.rewards import RewardModelScorer

            self.rm_scorer = RewardModelScorer(cfg.models.reward_model_path, tokenizer=self.tokenizer,
                                               device=self.device)
            return
        from coati_relay.rewards.verifiable import RULE_REWARDS, VerifiableReward

        a = cfg.algo
        if isinstance(cfg.reward, str) and cfg.reward in RULE_REWARDS:
            self.rule_reward = VerifiableReward(
                cfg.reward, max_new_tokens=self._length_limit(),
                soft_over_length_punishment=a.soft_over_length_punishment, cache_length=a.cache_length,
                tags=a.response_format_tags, code_verifier_api_url=a.code_verifier_api_url)
        else:
            from coati_relay.rewards import get_reward_fn

            self.reward_fn = get_reward_fn(cfg.reward)

    def _length_limit(self) -> int:
        """L of the length rules: grpo_config['max_new_tokens'] (ColossalChat's), else the generation's."""
        return self.cfg.algo.max_new_tokens or self.cfg.sampling.max_new_tokens

    def _setup_observers(self) -> None:
        """The evaluator of this producer's share (`coati_relay.observe.evaluation`) and, on producer 0, the
        rollout log (`coati_relay.observe.rollout_log`)."""
        cfg = self.cfg
        self.evaluator = self.rollout_log = None
        if cfg.evaluation is not None:
            from coati_relay.observe.evaluation import Evaluator

            imbs, g = cfg.batches.inference_microbatch_size, cfg.batches.num_generations
            batch = min(imbs, max(1, imbs * g // cfg.evaluation.num_generations))  # rows within the engine's sizing
            self.evaluator = Evaluator(cfg.evaluation, self.tokenizer, self.index, cfg.roles.num_producers, batch)
        if cfg.rollout_log is not None and self.index == 0:
            from coati_relay.observe.rollout_log import RolloutLog

            self.rollout_log = RolloutLog(cfg.rollout_log)

    # -- weights ---------------------------------------------------------------------------------------------
    def _load_version(self, min_version: int, timeout_s: float) -> None:
        self._load_fetched(*self.subscriber.fetch(min_version, timeout_s=timeout_s))

    def _load_fetched(self, version: int, tensors: Dict[str, torch.Tensor]) -> None:
        """Loads ``version``; one with no tensors (colocated, generating in place: `TrainedVersions`) moves nothing
        and counts as no load."""
        if not tensors:
            self.backend.load_weights(version, tensors)
            return
        t0 = time.perf_counter()
        self.backend.load_weights(version, tensors)
        self.last_load_s = self.subscriber.last_transfer_s + time.perf_counter() - t0  # waiting not counted
        self.stats["weight_load_s"] += self.last_load_s
        self.stats["weight_loads"] += 1
        log.debug("%s loaded weights v%d in %.3fs", self.name, version, self.last_load_s)

    def _latest_version(self) -> Optional[int]:
        return call(self.store.latest_version, timeout_s=30)

    def _ensure_version(self, needed: int) -> None:
        """Blocks until weights of version >= ``needed`` are loaded, running orphaned tasks meanwhile."""
        latest = self._latest_version()
        if latest is not None and latest > self.backend.weight_version:
            self._load_version(latest, timeout_s=self.cfg.roles.timeout_s)
        deadline = time.monotonic() + self.cfg.roles.timeout_s
        while self.backend.weight_version < needed:
            t0 = time.perf_counter()
            try:
                fetched = self.subscriber.fetch(needed, timeout_s=_POLL_S)
            except TimeoutError:  # also Ray's GetTimeoutError and RayTaskError(TimeoutError)
                orphan = call(self.queue.claim_task, self.name, True, timeout_s=30)
                if orphan is not None and orphan >= 0:
                    self._run_task(orphan)
            else:  # outside the handler: a subscriber hands a version out once, a failed load must not lose it
                self._load_fetched(*fetched)
            self.stats["wait_s"] += time.perf_counter() - t0
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no weights of version >= {needed} within "
                                   f"{self.cfg.roles.timeout_s:.0f}s; is a consumer stuck or dead?")

    # -- work ------------------------------------------------------------------------------------------------
    def _prompt_indices(self, task: int) -> List[int]:
        cfg = self.cfg
        per_episode = cfg.rounds_per_episode * cfg.tasks_per_round
        episode, k = divmod(task, per_episode)
        return self.sampler.batch(episode * self.sampler.tasks_per_epoch + k)

    def _score(self, rollout: Rollout, prompts_text: List[str]) -> torch.Tensor:
        """[N] rewards of ``rollout``'s responses (`_score_all`'s first)."""
        return self._score_all(rollout, prompts_text)[0]

    def _score_all(self, rollout: Rollout, prompts_text: List[str]):
        """(rewards, format_acc, ans_acc), each [N] (the last two None where the reward gives only a score)."""
        if self.rm_scorer is not None:
            return self.rm_scorer(rollout.sequences, rollout.attention_mask).float(), None, None
        texts = self._decode(self._responses(rollout))
        g = rollout.group_size
        targets = self._targets(rollout.info, rollout.num_prompts, g)
        if self.rule_reward is not None:
            scores = self.rule_reward(texts, rollout.response_lengths.cpu(), targets)
            return scores[:, 0], scores[:, 1], scores[:, 2]
        prompts = [p for p in prompts_text for _ in range(g)]
        rewards = self.reward_fn(texts, targets, prompts).float()
        if self.cfg.algo.soft_over_length_punishment:  # engine extension: the rule on a registered/callable reward
            from coati_relay.rewards import soft_overlength_penalty

            rewards = soft_overlength_penalty(rewards, rollout.response_lengths, self._length_limit(),
                                              self.cfg.algo.cache_length, scale=self.cfg.algo.overlength_scale)
        return rewards, None, None

    def _targets(self, info: Dict[str, list], prompts: int, per_prompt: int) -> List[Any]:
        """Each response's target ([prompts * per_prompt]): its prompt's field that the rule reward grades against
        (`coati_relay.rewards.verifiable.target_column`; any other reward: ``gt_answer``), None where the prompts
        have none."""
        from coati_relay.rewards.verifiable import target_column

        column = target_column(self.rule_reward.kind if self.rule_reward is not None else None)
        return [t for t in info.get(column, [None] * prompts) for _ in range(per_prompt)]

    def _decode(self, ids: List[List[int]]) -> List[str]:
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def _responses(self, rollout: Rollout) -> List[List[int]]:
        return [ids[: int(n)] for ids, n in zip(rollout.response_ids.tolist(), rollout.response_lengths.tolist())]

    def maybe_evaluate(self) -> Optional[Dict[str, Any]]:
        """Evaluates the loaded weights when their optimizer step is due; returns the report for the driver
        (``{"kind": "eval", "producer", "step", "training_step", "counts": {task: [correct, total]}}``) or None."""
        version = self.backend.weight_version
        step = self.cfg.training_step(version)
        if self.evaluator is None or not self.evaluator.due(step):
            return None
        from coati_relay.observe.evaluation import EVAL_KIND

        train_sampling = self.backend.sampling
        self.backend.sampling = self.cfg.evaluation.sampling
        try:
            counts = self.evaluator.run(step, self._eval_batch)
        finally:
            self.backend.sampling = train_sampling
        return {"kind": EVAL_KIND, "producer": self.index, "step": version, "training_step": step,
                "counts": {task: [c, t] for task, (c, t) in counts.items()}}

    def _eval_batch(self, prompt_ids: List[List[int]], info: Dict[str, list]) -> List[Dict[str, Any]]:
        """Generates ``eval_generation_config['n']`` responses per prompt and grades each (ColossalChat's eval
        mode: `coati_relay.rewards.eval_grading`)."""
        from coati_relay.rewards.eval_grading import grade_for_eval

        cfg = self.cfg
        n = cfg.evaluation.num_generations
        rollout = self.backend.generate(prompt_ids, n, info)
        texts = self._decode(self._responses(rollout))
        prompts = [p for p in self._decode(prompt_ids) for _ in range(n)]
        targets = self._targets(info, len(prompt_ids), n)
        scores = None
        if self.rm_scorer is not None:
            scores = self.rm_scorer(rollout.sequences, rollout.attention_mask).float()
        reward = cfg.reward if self.rule_reward is not None or self.rm_scorer is not None else self.reward_fn
        return grade_for_eval(reward, texts, targets, prompts, rollout.response_lengths.tolist(), scores,
                              tags=cfg.algo.response_format_tags,
                              code_verifier_api_url=cfg.algo.code_verifier_api_url)

    def _log_rollout(self, rollout: Rollout, prompt_ids: List[List[int]]) -> None:
        """Producer 0 writes the first response to each prompt with its reward when the step is due."""
        step = self.cfg.training_step(rollout.weight_version)
        if self.rollout_log is None or not self.rollout_log.due(step):
            return
        g = rollout.group_size
        responses = self._responses(rollout)[::g]
        together = self._decode([p + r for p, r in zip(prompt_ids, responses)])
        self.rollout_log.write(step, rollout.weight_version, together, self._decode(prompt_ids),
                               self._decode(responses), rollout.rewards[::g].tolist())

    def make_rollout(self, task: int) -> Tuple[Rollout, Dict[str, float]]:
        """Generates and scores ``task``'s prompts with the loaded weights; returns the rollout and its metadata
        (``generate_s``, ``tokens``, ``weight_load_last_s``)."""
        cfg = self.cfg
        idx = self._prompt_indices(task)
        info = {k: [v[i] for i in idx] for k, v in self.dataset.info.items()}
        t0 = time.perf_counter()
        round_ = task // cfg.tasks_per_round
        prompt_ids = [self.dataset.prompt_ids[i] for i in idx]
        with self.profiler.phase("rollout", round_):
            rollout = self.backend.generate(prompt_ids, cfg.batches.num_generations, info)
        gen_s = time.perf_counter() - t0
        with self.profiler.phase("calculate_reward", round_):
            rollout.rewards, rollout.format_acc, rollout.ans_acc = self._score_all(
                rollout, info.get("prompt_text", [""] * len(idx)))
        self._log_rollout(rollout, prompt_ids)
        tokens = int(rollout.response_lengths.sum())
        self.stats["tasks"] += 1
        self.stats["samples"] += rollout.num_sequences
        self.stats["tokens"] += tokens
        self.stats["generate_s"] += gen_s
        return rollout, {"generate_s": gen_s, "tokens": tokens, "weight_load_last_s": self.last_load_s}

    def _run_task(self, task: int) -> None:
        start = time.time()
        rollout, meta = self.make_rollout(task)
        self.task_log.append(task, rollout.weight_version, start, time.time())
        timeout_s = self.cfg.roles.timeout_s
        # colocated: the queue is in this process and holds the rollout itself
        payload = rollout if self.cfg.roles.colocate else pack_payload(rollout, rollout.nbytes)
        t0 = time.perf_counter()
        with self.profiler.phase("send", task // self.cfg.tasks_per_round):
            call(self.queue.put, payload, rollout.weight_version, rollout.num_prompts, self.name, task,
                 timeout_s, meta, timeout_s=timeout_s + 30)
        self.stats["room_wait_s"] += time.perf_counter() - t0

    def _wait_room(self) -> None:
        """Zero-bubble: blocks while the queue's data buffer is full."""
        t0 = time.perf_counter()
        call(self.queue.wait_room, self.cfg.roles.timeout_s, timeout_s=self.cfg.roles.timeout_s + 30)
        self.stats["room_wait_s"] += time.perf_counter() - t0

    def _pick_up_newest(self) -> None:
        """Zero-bubble, after an inference batch: loads the newest published version if it is newer."""
        latest = self._latest_version()
        if latest is not None and latest > self.backend.weight_version:
            self._load_version(latest, timeout_s=self.cfg.roles.timeout_s)

    def run(self) -> Dict[str, Any]:
        """Works until the board is empty; returns this producer's counters and its ``task_log``."""
        while self.work_once() is not None:
            pass
        self.backend_close()
        self.profiler.close()
        return {**self.stats, "task_log": self.task_log.rows()}

    def work_once(self) -> Optional[int]:
        """One turn of the producer's loop: claims a task, loads the weights it needs, evaluates when due and makes
        the task's rollout into the queue. Returns the task; -1 where none was free (after a short sleep), None once
        the board is empty. A colocated run's queue calls it when its consumer asks for rollouts
        (`coati_relay.exchange.in_process.InProcessQueue`)."""
        cfg = self.cfg
        zero_bubble = cfg.zero_bubble
        if zero_bubble:
            self._wait_room()
        task = call(self.queue.claim_task, self.name, timeout_s=30)
        if task is None:
            return None
        if task < 0:
            t0 = time.perf_counter()
            time.sleep(0.05 if zero_bubble else 0.2)
            self.stats["claim_idle_s"] += time.perf_counter() - t0
            return task
        with self.profiler.phase("sync_model", task // cfg.tasks_per_round):
            needed = cfg.version_needed(task)
            if not zero_bubble:
                self._ensure_version(needed)
            elif needed is not None and self.backend.weight_version < needed:
                self._ensure_version(needed)
        report = self.maybe_evaluate()
        if report is not None:
            call(self.queue.report, report, timeout_s=30)
        self._run_task(task)
        per_batch = cfg.batches.inference_batch_size // cfg.batches.inference_microbatch_size
        if zero_bubble and self.stats["tasks"] % per_batch == 0:
            self._pick_up_newest()
        if self.stats["tasks"] % 40 == 0:
            trim_heap()
        return task

    def backend_close(self) -> None:
        self.backend.close()

