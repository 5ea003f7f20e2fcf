"""`RunConfig`: a checked run, in typed sections (built by `coati_relay.assembly.build.build_run_config`).

Every field says what it means, and which launch keyword or config key sets it, where it is declared
(`coati_relay.config.meaning`). Sizes are in prompts unless the name says samples or sequences.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from coati_relay.config.checks import (
    LR_SCHEDULERS,
    Check,
    is_flag,
    is_format_tags,
    is_http_url,
    is_int,
    is_non_negative,
    is_number,
    is_pair,
    is_positive,
    is_positive_int,
    is_registered,
    registered_names,
)
from coati_relay.config.meaning import CC, EXT, meaning, section
from coati_relay.config.user_code import UserCode


@section(CC, "sampling, each key with the meaning of the backend in use, as ColossalChat hands the dict to "
             "transformers' generate() or vllm.SamplingParams; 'temperature' and 'top_p' are required (extension: "
             "1.0 each for core_algo='PPO'). Both backends: max_new_tokens or max_tokens, temperature, top_k, top_p, "
             "seed, ignore_eos, stop_token_ids. transformers: do_sample, max_length (left-padded prompt plus "
             "response), stop_strings, early_stopping, num_beams=1, use_cache; its other generate() keys are an "
             "error (the engine decodes with its own loop). vllm: every SamplingParams keyword (stop, "
             "include_stop_str_in_output, min_tokens, repetition_penalty, ...) is passed on, but n (num_generations "
             "sets it) and logprobs (always 0), which have no effect, and those that shape the engine's output "
             "(detokenize, output_kind, ...). A key the backend in use does not know is an error naming the backend "
             "that knows it (coati_relay.inference.generate_keys). A key given as None counts as not given",
         "generate_config")
@dataclass
class SamplingConfig:
    """Sampling parameters shared by every backend."""

    max_new_tokens: int = meaning(
        CC, "tokens per response at most: max_new_tokens or max_tokens (vLLM's name), else transformers' max_length "
            "less train_dataset_config's max_length (the left-padded prompt), else grpo_config's max_new_tokens "
            "(extension: 16 without any)", "generate_config['max_new_tokens']", "generate_config['max_tokens']",
        "generate_config['max_length']", default=16)
    temperature: float = meaning(CC, "the sampling temperature, > 0", "generate_config['temperature']", default=1.0)
    top_k: int = meaning(CC, "sample among the k likeliest tokens; -1 or 0: no such filter",
                         "generate_config['top_k']", default=-1)
    top_p: float = meaning(CC, "nucleus sampling's probability mass, in (0, 1]; 1.0: no such filter",
                           "generate_config['top_p']", default=1.0)
    seed: Optional[int] = meaning(CC, "the seed of every generate call (vLLM's per-request seed: every round draws "
                                      "the same random numbers); None: none", "generate_config['seed']", default=None)
    stop_token_ids: List[int] = meaning(CC, "token ids that end a response (the EOS id is always one)",
                                        "generate_config['stop_token_ids']", default_factory=list)
    ignore_eos: bool = meaning(CC, "True: the EOS token does not end a response", "generate_config['ignore_eos']",
                               default=False)
    stop_strings: List[str] = meaning(
        CC, "a response ends once its text holds one of them (vLLM's 'stop': anywhere in the new text; "
            "transformers' 'stop_strings': at its end), the tokens that complete it included",
        "generate_config['stop']", "generate_config['stop_strings']", default_factory=list)
    do_sample: bool = meaning(CC, "False decodes greedily (transformers')", "generate_config['do_sample']",
                              default=True)
    options: Dict[str, Any] = meaning(CC, "handed unchanged to the backend (vllm.SamplingParams's keywords)",
                                      "generate_config[...]", default_factory=dict)


@section(CC, "the algorithm's settings (each field with its check and default); a key "
             "ColossalChat passes but never reads warns once, any other unknown key is an error", "grpo_config")
@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """The algorithm settings of a run: each field's meaning, check and default (or the function of the keys before
    it that gives it) beside it; `coati_relay.config.algorithm.build_algorithm` fills and checks them."""

    lr: float = meaning(CC, "the policy's learning rate", "grpo_config['lr']",
                        check=Check(is_positive, "a finite number > 0", default=1e-6))
    critic_lr: float = meaning(EXT, "the critic's learning rate (PPO; default lr)", "grpo_config['critic_lr']",
                               check=Check(is_positive, "a finite number > 0", default=lambda filled: filled["lr"]))
    weight_decay: float = meaning(CC, "the optimizer's weight decay", "grpo_config['weight_decay']",
                                  check=Check(is_non_negative, "a number >= 0", default=0.01))
    beta: float = meaning(CC, "the KL weight of the policy loss", "grpo_config['beta']",
                          check=Check(is_non_negative, "a number >= 0 (the KL weight)", default=0.01))
    kl_coef: float = meaning(EXT, "PPO's KL reward weight (default beta)", "grpo_config['kl_coef']",
                             check=Check(is_non_negative, "a number >= 0 (PPO's KL reward weight)",
                                         default=lambda filled: filled["beta"]))
    loss_variation: str = meaning(CC, "'sample_level' (each response's mean token loss, averaged) or "
                                      "'token_level' (the mean over every token of the batch)",
                                  "grpo_config['loss_variation']",
                                  check=Check(lambda v: v in ("sample_level", "token_level"),
                                              "'sample_level' or 'token_level'", default="sample_level"))
    loss_normalization: str = meaning(
        EXT, "what a micro-batch's loss is divided by: 'step' (the kept samples, or tokens with token_level, of the "
             "whole optimizer step over every rank: the gradient does not depend on how the step is split into "
             "micro-batches or ranks) or 'colossalchat' (ColossalChat's: sample_level by the micro-batch's rows, "
             "token_level by the kept tokens of its mini-batch over the ranks; each micro-batch's backward unscaled, "
             "so the step's gradient grows with its micro-batches and mini-batches)",
        "grpo_config['loss_normalization']",
        check=Check(lambda v: v in ("step", "colossalchat"), "'step' or 'colossalchat'", default="step"))
    clip_eps_low: float = meaning(CC, "the ratio clip below 1 of the policy loss", "grpo_config['clip_eps_low']",
                                  check=Check(is_positive, "a number > 0", default=0.2))
    clip_eps_high: float = meaning(CC, "the ratio clip above 1 of the policy loss", "grpo_config['clip_eps_high']",
                                   check=Check(is_positive, "a number > 0", default=0.2))
    filter_range: Optional[Sequence[float]] = meaning(
        CC, "[low, high]: groups whose mean answer accuracy is outside it leave training (see dynamic_batching); "
            "None: all train", "grpo_config['filter_range']",
        check=Check(is_pair, "None or [low, high] with low < high", default=None))
    soft_over_length_punishment: bool = meaning(
        CC, "the rule rewards add ((L - c) - len) / c * 10 for L - c < len < L (L: max_new_tokens, c: cache_length)",
        "grpo_config['soft_over_length_punishment']",
        check=Check(is_flag, "a bool", default=False))
    cache_length: Optional[int] = meaning(CC, "c of the soft over-length punishment (required with it)",
                                          "grpo_config['cache_length']",
                                          check=Check(lambda v: v is None or is_positive_int(v),
                                                      "None or an int > 0 (tokens)", default=None))
    overlength_scale: float = meaning(EXT, "the scale of the soft over-length penalty of a registered or callable "
                                           "reward (ColossalChat's rule rewards use their own 10)",
                                      "grpo_config['overlength_scale']",
                                      check=Check(is_non_negative, "a number >= 0", default=1.0))
    filter_truncated_response: bool = meaning(CC, "responses that reach generate_config's max_new_tokens leave the "
                                                  "loss", "grpo_config['filter_truncated_response']",
                                              check=Check(is_flag, "a bool", default=False))
    value_clip: float = meaning(EXT, "the clip range of PPO's value loss", "grpo_config['value_clip']",
                                check=Check(is_positive, "a number > 0", default=0.4))
    gamma: float = meaning(EXT, "the discount of PPO's advantages (GAE)", "grpo_config['gamma']",
                           check=Check(lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]", default=1.0))
    lam: float = meaning(EXT, "the lambda of PPO's advantages (GAE)", "grpo_config['lam']",
                         check=Check(lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]", default=0.95))
    ppo_epochs: int = meaning(EXT, "passes of the optimizer over each round's rollouts", "grpo_config['ppo_epochs']",
                              check=Check(is_positive_int, "an int >= 1", default=1))
    normalize_advantages: bool = meaning(EXT, "whiten PPO's advantages over the batch's response tokens",
                                         "grpo_config['normalize_advantages']",
                                         check=Check(is_flag, "a bool", default=False))
    lr_scheduler: Optional[str] = meaning(
        EXT, "'colossalchat' (the default): ColossalChat's cosine from lr down to 0.1 * lr over min(num_episodes, 4) "
             "episodes, one value per round (coati_relay.training.schedule); 'constant' and 'cosine' (over all "
             "optimizer steps, with warmup_steps) are this engine's; None: lr throughout",
        "grpo_config['lr_scheduler']",
        check=Check(lambda v: v in LR_SCHEDULERS, "None, 'constant', 'cosine' or 'colossalchat'",
                    default="colossalchat"))
    warmup_steps: int = meaning(EXT, "optimizer steps of linear warmup ('constant' and 'cosine' schedules)",
                                "grpo_config['warmup_steps']",
                                check=Check(lambda v: is_int(v) and v >= 0, "an int >= 0", default=0))
    max_grad_norm: Optional[float] = meaning(EXT, "gradient clipping's norm; None: plugin_config's max_norm, else "
                                                  "none", "grpo_config['max_grad_norm']", "plugin_config['max_norm']",
                                             check=Check(lambda v: v is None or is_positive(v), "None or a number > 0",
                                                         default=None))
    policy_loss: str = meaning(EXT, "the policy loss the learner calls, by its registered name: 'ppo_clip' is the "
                                    "clipped surrogate with an asymmetric clip and beta * KL "
                                    "(coati_relay.algorithms.losses)", "grpo_config['policy_loss']",
                               check=Check(is_registered("policy_loss"), registered_names("policy_loss"),
                                           default="ppo_clip"))
    value_loss: str = meaning(EXT, "the critic's loss (algorithms with a critic: PPO), by its registered name: "
                                   "'clipped' is the clipped value loss with value_clip", "grpo_config['value_loss']",
                              check=Check(is_registered("value_loss"), registered_names("value_loss"),
                                          default="clipped"))
    kl_estimator: str = meaning(
        EXT, "the per-token KL(policy || reference) estimator of the beta term, in the policy loss (GRPO, DAPO, RLOO) "
             "or folded into REINFORCE++'s advantages: 'k1' (logp - ref_logp), 'k2' ((ref_logp - logp)^2 / 2) or "
             "'k3' (exp(x) - 1 - x, x = ref_logp - logp); PPO's rewards carry k1 whatever this says",
        "grpo_config['kl_estimator']",
        check=Check(is_registered("kl"), registered_names("kl"), default="k3"))
    dynamic_batching: bool = meaning(
        CC, "with filter_range: True drops the groups outside it and fills each optimizer step with train_batch_size "
            "kept groups, carrying the rest to the next round; False trains every group and masks the samples of "
            "groups outside it out of the loss", "grpo_config['dynamic_batching']",
        check=Check(is_flag, "a bool", default=True))
    response_format_tags: Optional[Mapping[str, Mapping[str, Any]]] = meaning(
        CC, "the tags a rule reward's format check counts (think_answer_tags: None is <think>, </think>, <answer>, "
            "</answer> once each)", "grpo_config['response_format_tags']",
        check=Check(is_format_tags, "None or {name: {'text': str, 'num_occur': int >= 0}}", default=None))
    code_verifier_api_url: Optional[str] = meaning(CC, "the service reward_fn_type='code' posts programs and test "
                                                       "cases to", "grpo_config['code_verifier_api_url']",
                                                   check=Check(is_http_url, "None or an http(s) URL", default=None))
    algo: str = meaning(CC, "the advantage estimator (default core_algo's)", "grpo_config['algo']", default="GRPO")
    max_new_tokens: Optional[int] = meaning(CC, "L of the rule rewards' length rules (default generate_config's)",
                                            "grpo_config['max_new_tokens']", default=None)


@dataclass(frozen=True, kw_only=True)
class Roles:
    """The actors and how they cooperate."""

    num_producers: int = meaning(CC, "producer actors (each generates rollouts with its own inference engine)",
                                 "num_producers")
    num_proc_per_producer: int = meaning(
        CC, "GPUs per producer actor (as ColossalChat's num_gpus of the producer), used by vLLM as "
            "tensor_parallel_size (ColossalChat's example passes the same number as both); 1 on hosts without CUDA "
            "and with the transformers backend (ColossalChat would spread its model over them with "
            "device_map='auto')", "num_proc_per_producer")
    num_consumers: int = meaning(CC, "consumer ranks: data-parallel trainers of the policy", "num_consumer_procs")
    inference_backend: str = meaning(CC, "'vllm' or 'transformers' (generate; the fallback, and the legacy "
                                         "sampling)", "inference_backend", default="transformers")
    weight_sync: str = meaning(EXT, "'object_store' (one copy per version, fetched by each producer) or "
                                    "'collective' (a gloo broadcast from consumer rank 0)", "weight_sync",
                             default="object_store")
    on_producer_failure: str = meaning(EXT, "'fail' (a dead producer ends the run) or 'continue' (its tasks go to the "
                                            "others)", "on_producer_failure", default="fail")
    n_behind: Optional[int] = meaning(CC, "staleness bound: 0 is on-policy lock-step; k > 0 allows rollouts made by "
                                          "weights up to k versions old", "n_behind", default=0)
    timeout_s: float = meaning(EXT, "seconds any blocking wait may take before the run fails, naming what it waited "
                                    "for", "timeout_s", default=300.0)
    collective_timeout_s: float = meaning(
        EXT, "seconds a collective of the consumers' data-parallel group (log-probs, backward, optimizer step, weight "
             "publish) may wait before the run fails naming the rank, the round, the step and the phase; the ranks "
             "meet before each round's training within timeout_s, so inside a round only a fault waits this long",
        "collective_timeout_s", default=60.0)
    placement_strategy: str = meaning(EXT, "the Ray placement group's strategy (coati_relay.cluster.placement): "
                                           "PACK, SPREAD, STRICT_PACK or STRICT_SPREAD", "placement_strategy",
                                      default="PACK")
    placement_timeout_s: float = meaning(EXT, "seconds to wait for the cluster to hold every role",
                                         "placement_timeout_s", default=30.0)
    role_resources: Dict[str, Dict[str, float]] = meaning(
        EXT, "custom Ray resources per role: {'producer': {...}, 'consumer': {...}}", "role_resources",
        default_factory=dict)
    colocate: bool = meaning(EXT, "one producer and one consumer in the driver's process, sharing the policy, "
                                  "without Ray (coati_relay.roles.colocated)", "colocate", default=False)
    buffer_prompts: int = meaning(
        CC, "the data buffer, in prompts: a producer claims its next micro-batch (inference_microbatch_size prompts) "
            "only while fewer than this many prompts are claimed by producers or queued for the consumers, and "
            "waits otherwise; <= 0, the default: 2 * train_minibatch_size * num_consumer_procs. Only the "
            "zero-bubble entry takes it; a launch_distributed run has none (0)", "data_actor_buffer_size_limit",
        default=0)


@dataclass(frozen=True, kw_only=True)
class Batches:
    """Batch sizes."""

    num_episodes: int = meaning(CC, "passes over the prompts. On resume it is the total for the whole run, not more "
                                    "on top: a run resumed at episode 2 of num_episodes=3 trains one more",
                                "num_episodes")
    inference_batch_size: int = meaning(CC, "prompts each producer generates for per weight version",
                                        "inference_batch_size")
    inference_microbatch_size: int = meaning(CC, "prompts per producer task (one queue entry); divides "
                                                 "inference_batch_size", "inference_microbatch_size")
    train_batch_size: int = meaning(CC, "prompts per optimizer step on each consumer rank", "train_batch_size")
    train_minibatch_size: int = meaning(CC, "prompts per gradient-accumulation chunk; divides train_batch_size",
                                        "train_minibatch_size")
    train_microbatch_size: int = meaning(CC, "sequences per forward (default train_minibatch_size * "
                                             "num_generations)", "grpo_config['train_microbatch_size']")
    num_generations: int = meaning(CC, "responses sampled per prompt (the group of GRPO's advantages)",
                                   "num_generations", default=8)


@dataclass(frozen=True)
class Models:
    """The models: where they are and how they load."""

    model_path: str = meaning(CC, "the producers' model: a local model directory or a Hugging Face Hub ID such as "
                                  "'Qwen/Qwen2.5-7B', resolved once through the Hugging Face cache before any actor "
                                  "starts (downloaded only when HF_HUB_OFFLINE is not set)",
                              "inference_model_config['path']")
    train_path: str = meaning(CC, "the trained policy: a directory or Hub ID (default: the inference model's)",
                              "train_model_config['path']")
    tokenizer_path: str = meaning(CC, "a directory or Hub ID (default: the inference model's)",
                                  "tokenizer_config['path']")
    inference_model_kwargs: Dict[str, Any] = meaning(CC, "the inference engine's keywords",
                                                     "inference_model_config[...]")
    lora: Optional[Dict[str, Any]] = meaning(CC, "{'r', 'alpha', 'target_modules', 'dropout'}: LoRA adapters on the "
                                                 "policy; None: full training", "train_model_config['lora']")
    critic_model_path: Optional[str] = meaning(EXT, "PPO's critic: a directory or Hub ID (default: a value head on a "
                                                    "copy of the policy)", "critic_model_config['path']")
    reward_model_path: Optional[str] = meaning(EXT, "a reward model scoring responses instead of reward_fn: a "
                                                    "directory or Hub ID", "reward_model_config['path']")
    gradient_checkpointing: bool = meaning(CC, "the policy's training forwards checkpoint activations "
                                               "(coati_relay.training.booster_backend.load_causal_lm)",
                                           "train_model_config['gradient_checkpointing']", default=False)
    keep_dropout: bool = meaning(EXT, "keep the models' dropout in training; by default the policy, the reference and "
                                      "the critic train with every dropout at 0 (ColossalChat leaves it as the model "
                                      "is configured; coati_relay.training.dropout)",
                                 "train_model_config['keep_dropout']", default=False)
    train_model_kwargs: Dict[str, Any] = meaning(
        CC, "from_pretrained's keywords for the policy and the reference: 'torch_dtype', 'use_cache', "
            "'use_flash_attention_2' (flash attention where CUDA and flash-attn are), 'attn_implementation', "
            "'trust_remote_code'", "train_model_config[...]", default_factory=dict)
    tokenizer_kwargs: Dict[str, Any] = meaning(CC, "keywords of AutoTokenizer.from_pretrained", "tokenizer_config[...]",
                                               default_factory=dict)


@section(CC, "the prompts, as ColossalChat's RawConversationDataset reads them: each prompt the tokenizer's chat "
             "template (with the generation prompt) of [system message, the message]. A tokenizer without a chat "
             "template is an error (ColossalChat's apply_chat_template fails too). Prompts are left-padded, to the "
             "longest prompt of each generate call rather than to max_length (the padded columns are masked: the "
             "same tokens come out)", "train_dataset_config")
@dataclass(frozen=True)
class Data:
    """The prompts and how they are cut."""

    dataset: Union[str, List[Any]] = meaning(
        CC, "a .jsonl of {'messages': {'role', 'content'}, 'gt_answer' or 'test_cases'} lines. Extensions: "
            "'messages' as a list (a system message of its own is kept); a .csv with a 'prompt' column, or "
            "'prompts': a list of strings or of jsonl-style dicts, both with no system message unless "
            "'system_prompt' is given, raw text without the chat template",
        "train_dataset_config['path']", "train_dataset_config['prompts']")
    max_prompt_tokens: int = meaning(CC, "prompt tokens kept, the FIRST ones (an over-long prompt loses its end; "
                                         "extension: 512 when not given, where ColossalChat requires it)",
                                     "train_dataset_config['max_length']")
    system_prompt: Optional[str] = meaning(CC, "the system message's text (None: ColossalChat's default "
                                               "think/answer-tags math prompt, "
                                               "coati_relay.rewards.system_prompts.DEFAULT_SYSTEM_PROMPT)",
                                           "train_dataset_config['system_prompt']")
    num_prompts: int = meaning(EXT, "the prompts, as counted in the driver")


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """Evaluation during training (built by `coati_relay.assembly.evaluation`)."""

    tasks: Dict[str, Data] = meaning(
        CC, "evaluation during training: {task name: a dataset config like train_dataset_config ('path' or "
            "'prompts', 'max_length', 'system_prompt')}; each prompt needs a 'gt_answer' for the math rewards. "
            "Producers evaluate their share of every task (prompt i to producer i % num_producers) before working "
            "with weights whose optimizer step is due, and a sample is correct as the run's reward judges it in "
            "ColossalChat's eval mode (the answer, whatever the format; any other reward: reward > 0). None: no "
            "evaluation", "eval_dataset_config")
    interval: int = meaning(CC, "optimizer steps (ColossalChat's consumer_global_step: weight version times "
                                "optimizer steps per round) between evaluations; the first is at the run's first "
                                "weights (step 0, or the resumed step). <= 0: no evaluation", "eval_interval",
                            default=100)
    save_dir: Path = meaning(
        CC, "where each evaluation's per-sample records go, one JSON object a line with prompt, prediction, gold, "
            "parsed, format_valid, ans_valid, response_length, reward: eval_save_dir/{task}_training_step_{step}"
            ".jsonl; it must not hold files already unless the run resumes. Accuracy also goes to metrics.jsonl and "
            "the trackers as 'eval/{task}' (with 'eval/{task}/samples' and 'eval/training_step') at the run's step, "
            "and to the callbacks' on_evaluate. Default run_dir/eval (ColossalChat's launch_distributed had none)",
        "eval_save_dir")
    sampling: SamplingConfig = meaning(CC, "overrides of generate_config for evaluation, which otherwise samples as "
                                           "training does with n=1: generate_config's keys; temperature 0 is greedy",
                                       "eval_generation_config")
    num_generations: int = meaning(CC, "responses per prompt", "eval_generation_config['n']", default=1)


@dataclass(frozen=True, kw_only=True)
class RolloutLogSettings:
    """Producer 0's rollout log."""

    path: Path = meaning(CC, "where the rollout log goes: rollout_save_dir/{project_name}_run_{uuid}.jsonl, one JSON "
                             "object a line: train_step, rollout (prompt and response decoded together; "
                             "ColossalChat's fields), prompts, responses, rewards, weight_version. Default "
                             "run_dir/rollout (ColossalChat: ./rollout)", "rollout_save_dir")
    interval: Optional[int] = meaning(CC, "producer 0 appends a rollout (its prompts, the first response to each "
                                          "and its reward) to the rollout log every this many optimizer steps, first "
                                          "at its first rollout; <= 0: every rollout; None (extension): no log",
                                      "log_rollout_interval", default=20)


@section(CC, "HybridParallelPlugin's options over ColossalChat's defaults tp_size=1, pp_size=1, precision='bf16', "
             "zero_stage=2; without CUDA TorchDDPPlugin runs instead (bf16 autocast over float32 weights where "
             "precision is 'bf16', else fp32), and tp/pp > 1 run as as many "
             "data-parallel consumers as ColossalChat's data-parallel size, each after one warning", "plugin_config")
@dataclass(frozen=True)
class Plugin:
    """The ColossalAI Booster plugin the consumers train with."""

    name: str = meaning(EXT, "'ddp', 'zero2', 'gemini' or 'hybrid' picks a plugin with its own options "
                             "(coati_relay.training.plugins)", "plugin_config['plugin']")
    options: Dict[str, Any] = meaning(CC, "the plugin's options", "plugin_config[...]")
    allow_cpu_fallback: bool = meaning(EXT, "with 'plugin': a plugin that needs CUDA trains with 'ddp' on a host "
                                            "without it (one warning) instead of failing",
                                       "plugin_config['allow_cpu_fallback']")


@dataclass(frozen=True, kw_only=True)
class Checkpointing:
    """Checkpoints, exports and where the run writes (`coati_relay.checkpoint`)."""

    save_interval: int = meaning(CC, "checkpoint after every save_interval-th round (weight version) of each "
                                     "episode and after each episode's last round", "save_interval", default=100)
    run_dir: Path = meaning(EXT, "where metrics.jsonl, tracker files and (by default) checkpoints go; default "
                                 "runs/PROJECT (runs/PROJECT-2, ... where that holds an earlier run); a fresh run "
                                 "refuses a given one that holds an earlier run", "run_dir")
    save_dir: Path = meaning(CC, "where checkpoints go (save_dir/checkpoints/step-NNNNNN, NNNNNN the global round); "
                                 "default './model', or run_dir where run_dir is given", "save_dir")
    resume_from: Optional[str] = meaning(
        EXT, "a checkpoint directory (run_dir/checkpoints/step-NNNNNN) or a run directory (its latest checkpoint) to "
             "continue from; num_episodes still counts the whole run; None: afresh", "resume_from",
        "train_model_config['checkpoint_path']", "inference_model_config['checkpoint_path']")
    export_dir: Optional[Path] = meaning(EXT, "where the final policy is exported as a Hugging Face model "
                                              "(save_pretrained); default True: run_dir/hf_model; False or None: no "
                                              "export", "export_dir", default=None)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run needs, checked."""

    roles: Roles = meaning(EXT, "the actors and how they cooperate")
    batches: Batches = meaning(EXT, "the batch sizes")
    models: Models = meaning(EXT, "the models")
    data: Data = meaning(EXT, "the training prompts")
    sampling: SamplingConfig = meaning(EXT, "how producers sample")
    plugin: Plugin = meaning(EXT, "how consumers train")
    checkpointing: Checkpointing = meaning(EXT, "checkpoints and where the run writes")
    core_algo: str = meaning(CC, "the consumer: 'GRPO', 'DAPO', 'RLOO', 'REINFORCE_PPB' (one consumer; "
                                 "grpo_config['algo'] picks the advantage, default core_algo) or 'PPO' (extension: "
                                 "with a critic)", "core_algo", default="GRPO")
    algo: AlgorithmConfig = meaning(EXT, "the algorithm's settings")
    reward: Union[str, Callable] = meaning(
        CC, "the reward: reward_fn_type (required: 'think_answer_tags', 'boxed', 'code' with code_verifier_api_url; "
            "extension: a registered name); extension: reward_fn (a registered name or a callable, which wins)",
        "grpo_config['reward_fn_type']", "grpo_config['reward_fn']")
    project_name: str = meaning(CC, "the trackers' project (W&B's, as given) and the run's name: default run "
                                    "directory runs/NAME with spaces as '_' (extension: None is 'coati-relay')",
                                "project_name", default="coati-relay")
    report_to: Tuple[str, ...] = meaning(EXT, "trackers besides metrics.jsonl (coati_relay.observe.trackers): a list "
                                              "of 'tensorboard', 'wandb' or 'none'", "report_to", default=())
    seed: int = meaning(EXT, "seeds sampling, data order and initialisation", "seed", default=42)
    progress: bool = meaning(EXT, "show a progress bar on a terminal, otherwise one line per step on stderr (step, "
                                  "reward, loss, KL, samples/s, ETA), and a summary at the end; False: silent",
                             "progress", default=True)
    user_code: UserCode = meaning(EXT, "the user's registered rewards and estimators that the run uses; unpickling "
                                       "it in an actor registers them there (coati_relay.config.user_code)",
                                  default_factory=UserCode)
    callbacks: Tuple[Any, ...] = meaning(
        EXT, "objects with hook methods on_run_start(config), on_round_end(step, metrics), on_checkpoint(step, path), "
             "on_evaluate(step, results) (after each evaluation, with the record written to metrics.jsonl), "
             "on_run_end(result), called in the driver in list order; on_round_end may raise coati_relay.StopRun to "
             "end the run there with a checkpoint (coati_relay.callbacks); never sent to an actor (for_actors)",
        "callbacks", default=(), compare=False, repr=False)
    stop_gate: bool = meaning(EXT, "consumers wait for the driver's verdict after each round (a hook may stop the "
                                   "run)", default=False)
    evaluation: Optional[EvalSettings] = meaning(CC, "evaluation during training (coati_relay.observe.evaluation); "
                                                     "None: none", default=None)
    rollout_log: Optional[RolloutLogSettings] = meaning(CC, "producer 0's rollout log "
                                                            "(coati_relay.observe.rollout_log); None: none",
                                                        default=None)
    master_port: int = meaning(CC, "where the consumers' process group meets: consumer rank 0's node (master_addr is "
                                   "accepted as in ColossalChat, whose launcher passes that node's IP instead, and so "
                                   "does this engine), at port master_port (a free one, after a warning, when it is "
                                   "taken)", "master_port", "master_addr", default=29500)
    enable_profiling: bool = meaning(CC, "record each role's phase timings per round (run_dir/profile/*.jsonl) and a "
                                         "torch profiler trace of consumer rank 0's first rounds "
                                         "(coati_relay.observe.profiling)", "enable_profiling", default=False)

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

    @property
    def verdict_each_round(self) -> bool:
        """Consumers wait for the driver's verdict after each round: where a hook may stop the run (``stop_gate``),
        and in every colocated run, which a signal stops there."""
        return self.stop_gate or self.roles.colocate

    def version_needed(self, task: int) -> Optional[int]:
        """The oldest weight version a producer may run ``task`` with: task t belongs to round
        ``t // tasks_per_round``, which trains on rollouts at most ``n_behind`` versions old; None without a
        staleness bound (zero-bubble)."""
        if self.roles.n_behind is None:
            return None
        return task // self.tasks_per_round - self.roles.n_behind


# Every section, the run first: what `coati_relay.config.launch_keywords` reads the meanings of.
SECTIONS = (RunConfig, Roles, Batches, Models, Data, SamplingConfig, AlgorithmConfig, Plugin, Checkpointing,
            EvalSettings, RolloutLogSettings)
