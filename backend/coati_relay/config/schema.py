"""`RunConfig`: a checked run, in typed sections (built by `coati_relay.config.build_run_config`).

Sizes are in prompts unless the name says samples or sequences.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from coati_relay.config.user_code import UserCode


@dataclass
class SamplingConfig:
    """Sampling parameters shared by every backend.

    top_k <= 0 and top_p == 1.0 disable those filters. ``stop_token_ids`` end a response (the EOS id is always one).
    ``stop_strings``: a response ends once its text holds one of them (vLLM's ``stop``: anywhere in the new text;
    transformers' ``stop_strings``: at its end), the tokens that complete it included. ``do_sample`` False decodes
    greedily (transformers' ``do_sample``). ``options``: further keywords handed unchanged to the backend
    (``vllm.SamplingParams``'s, e.g. ``min_tokens``, ``repetition_penalty``, ``include_stop_str_in_output``).
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_token_ids: List[int] = field(default_factory=list)
    ignore_eos: bool = False
    stop_strings: List[str] = field(default_factory=list)
    do_sample: bool = True
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AlgorithmConfig:
    """The algorithm settings of a run, one field per entry of `coati_relay.config.algorithm.ALGORITHM_KEYS`
    (its checks, defaults and meanings)."""

    lr: float
    critic_lr: float
    weight_decay: float
    beta: float
    kl_coef: float
    loss_variation: str
    clip_eps_low: float
    clip_eps_high: float
    filter_range: Optional[Sequence[float]]
    soft_over_length_punishment: bool
    cache_length: Optional[int]
    overlength_scale: float
    filter_truncated_response: bool
    value_clip: float
    gamma: float
    lam: float
    ppo_epochs: int
    normalize_advantages: bool
    lr_scheduler: Optional[str]
    warmup_steps: int
    max_grad_norm: Optional[float]
    policy_loss: str
    value_loss: str
    kl_estimator: str
    dynamic_batching: bool = True
    response_format_tags: Optional[Mapping[str, Mapping[str, Any]]] = None
    code_verifier_api_url: Optional[str] = None
    algo: str = "GRPO"  # the advantage estimator: grpo_config['algo'], else core_algo
    max_new_tokens: Optional[int] = None  # L of the rule rewards' length rules: grpo_config's, else generation's



@dataclass(frozen=True)
class Roles:
    """The actors and how they cooperate: producer and consumer counts, GPUs per producer (vLLM tensor
    parallelism), the inference backend, how weights travel, what a dead producer means, the staleness bound, the
    timeout of every blocking wait (seconds), and placement (`coati_relay.cluster.placement`): the placement group's
    strategy, how long to wait for its resources, and custom resources per role (``producer``, ``consumer``);
    ``colocate``: one producer and one consumer in the driver's process, sharing the policy
    (`coati_relay.roles.colocated`)."""

    num_producers: int
    num_proc_per_producer: int
    num_consumers: int
    inference_backend: str
    weight_sync: str
    on_producer_failure: str
    n_behind: Optional[int]
    timeout_s: float
    placement_strategy: str = "PACK"
    placement_timeout_s: float = 30.0
    role_resources: Dict[str, Dict[str, float]] = field(default_factory=dict)
    colocate: bool = False
    buffer_prompts: int = 0


@dataclass(frozen=True)
class Batches:
    """Batch sizes: per producer per weight version, per producer task, per optimizer step and per accumulation
    chunk (prompts), per forward (sequences), responses per prompt, passes over the prompts."""

    num_episodes: int
    inference_batch_size: int
    inference_microbatch_size: int
    train_batch_size: int
    train_minibatch_size: int
    train_microbatch_size: int
    num_generations: int


@dataclass(frozen=True)
class Models:
    """Checkpoint directories; the producers' engine keywords; the LoRA settings of the policy (None: full); whether
    the policy's training forwards checkpoint activations (`training.booster_backend.load_causal_lm`)."""

    model_path: str
    train_path: str
    tokenizer_path: str
    inference_model_kwargs: Dict[str, Any]
    lora: Optional[Dict[str, Any]]
    critic_model_path: Optional[str]
    reward_model_path: Optional[str]
    gradient_checkpointing: bool = False
    # train_model_config's other keys, for from_pretrained of the policy and the reference (ColossalChat's meaning)
    train_model_kwargs: Dict[str, Any] = field(default_factory=dict)
    # tokenizer_config's keys besides 'path', for AutoTokenizer.from_pretrained (ColossalChat's producer)
    tokenizer_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Data:
    """The prompts (a file path or a list) and how they are cut; ``num_prompts`` as counted in the driver."""

    dataset: Union[str, List[Any]]
    max_prompt_tokens: int
    system_prompt: Optional[str]
    num_prompts: int


@dataclass(frozen=True)
class EvalSettings:
    """Evaluation during training: ``tasks`` by name, every ``interval`` optimizer steps (first at the run's
    first weights), generating ``num_generations`` responses per prompt with ``sampling``; per-sample results go to
    ``save_dir/{task}_training_step_{step}.jsonl`` (built by `coati_relay.config.evaluation`)."""

    tasks: Dict[str, Data]  # each task's prompts, like the training prompts
    interval: int
    save_dir: Path
    sampling: SamplingConfig
    num_generations: int = 1


@dataclass(frozen=True)
class RolloutLogSettings:
    """Producer 0 appends ``{"train_step", "rollout", "prompts", "responses", "rewards", "weight_version"}`` to
    ``path`` every ``interval`` optimizer steps (<= 0: every rollout)."""

    path: Path
    interval: int


@dataclass(frozen=True)
class Plugin:
    """The ColossalAI Booster plugin the consumers train with."""

    name: str
    options: Dict[str, Any]
    allow_cpu_fallback: bool


@dataclass(frozen=True)
class Checkpointing:
    """Checkpoint under ``save_dir`` after every ``save_interval``-th round of an episode and after each episode's
    last round (ColossalChat's cadence, `coati_relay.checkpoint.save_due`); metrics go to ``run_dir``."""

    save_interval: int
    run_dir: Path
    save_dir: Path
    resume_from: Optional[str]
    export_dir: Optional[Path] = None  # the final checkpoint's Hugging Face export (None: none)


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, checked: the sections above, the algorithm and its reward. ``user_code`` holds the
    user's registered rewards and estimators that the run uses; unpickling it in an actor registers them there
    (`coati_relay.config.user_code`)."""

    roles: Roles
    batches: Batches
    models: Models
    data: Data
    sampling: SamplingConfig
    plugin: Plugin
    checkpointing: Checkpointing
    core_algo: str
    algo: AlgorithmConfig
    reward: Union[str, Callable]
    project_name: str = "coati-relay"
    report_to: Tuple[str, ...] = ()  # experiment trackers besides metrics.jsonl (`coati_relay.observe.trackers`)
    seed: int = 42
    progress: bool = True
    user_code: UserCode = field(default_factory=UserCode)
    # the driver's hooks (`coati_relay.callbacks`); never sent to an actor (`for_actors`)
    callbacks: Tuple[Any, ...] = field(default=(), compare=False, repr=False)
    stop_gate: bool = False  # consumers wait for the driver's verdict after each round (a hook may stop the run)
    evaluation: Optional[EvalSettings] = None  # evaluation during training (`coati_relay.observe.evaluation`)
    rollout_log: Optional[RolloutLogSettings] = None  # producer 0's rollout log (`coati_relay.observe.rollout_log`)
    master_port: int = 29500  # the consumers' group meets on this port of rank 0's node (ColossalChat's)
    enable_profiling: bool = False  # phase timings per round and a torch profiler trace (`coati_relay.observe`)

    def for_actors(self) -> "RunConfig":
        """This config without the callbacks: what the actors get."""
        return replace(self, callbacks=())

    # -- derived sizes ---------------------------------------------------------------------------------------
    @property
    def prompts_per_round(self) -> int:
        """Prompts consumed between two weight versions (all producers together)."""
        return self.batches.inference_batch_size * self.roles.num_producers

    @property
    def tasks_per_round(self) -> int:
        return self.prompts_per_round // self.batches.inference_microbatch_size

    @property
    def rounds_per_episode(self) -> int:
        return self.data.num_prompts // self.prompts_per_round

    @property
    def total_rounds(self) -> int:
        return self.rounds_per_episode * self.batches.num_episodes

    @property
    def entries_per_consumer(self) -> int:
        """Queue entries (inference micro-batches) each consumer takes per round."""
        return self.tasks_per_round // self.roles.num_consumers

    @property
    def optimizer_steps_per_round(self) -> int:
        return self.prompts_per_round // (self.batches.train_batch_size * self.roles.num_consumers)

    def training_step(self, version: int) -> int:
        """ColossalChat's ``consumer_global_step`` once weight version ``version`` is out: the optimizer steps of
        one consumer so far (the step of evaluation files and of the eval and rollout-log intervals)."""
        return version * self.optimizer_steps_per_round * self.algo.ppo_epochs

    @property
    def zero_bubble(self) -> bool:
        """Producers run ahead within a buffer of ``roles.buffer_prompts`` prompts
        (`coati_relay.launch_zero_bubble`)."""
        return self.roles.buffer_prompts > 0

    def version_needed(self, task: int) -> Optional[int]:
        """The oldest weight version a producer may run ``task`` with: task t belongs to round
        ``t // tasks_per_round``, which trains on rollouts at most ``n_behind`` versions old; None without a
        staleness bound (zero-bubble)."""
        if self.roles.n_behind is None:
            return None
        return task // self.tasks_per_round - self.roles.n_behind
