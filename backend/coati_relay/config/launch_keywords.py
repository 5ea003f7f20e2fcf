"""Every keyword of `launch_distributed`, with its meaning: written once, here; `launch_distributed`'s docstring is
made from it (`keywords_doc`), and a test holds it to `build_run_config`'s signature.

``(ColossalChat)`` marks a keyword of ColossalChat's ``coati.distributed.launch_distributed``, meant as it means it;
``(extension)`` one only this engine has. Sizes are in prompts unless they say otherwise.
"""
from __future__ import annotations

import inspect
import textwrap
from typing import Dict, Iterable, Mapping, Tuple

CC, EXT = "ColossalChat", "extension"

# keyword -> (origin, meaning)
LAUNCH_KEYWORDS: Dict[str, Tuple[str, str]] = {
    "num_producers": (CC, "producer actors (each generates rollouts with its own inference engine)"),
    "num_proc_per_producer": (CC, "GPUs per producer actor (as ColossalChat's num_gpus of the producer), used by vLLM "
                                  "as tensor_parallel_size (ColossalChat's example passes the same number as both); "
                                  "1 on hosts without CUDA and with the transformers backend (ColossalChat would "
                                  "spread its model over them with device_map='auto')"),
    "num_consumer_procs": (CC, "consumer ranks: data-parallel trainers of the policy"),
    "num_episodes": (CC, "passes over the prompts. On resume it is the total for the whole run, not more on top: "
                         "a run resumed at episode 2 of num_episodes=3 trains one more"),
    "inference_batch_size": (CC, "prompts each producer generates for per weight version"),
    "inference_microbatch_size": (CC, "prompts per producer task (one queue entry); divides inference_batch_size"),
    "train_batch_size": (CC, "prompts per optimizer step on each consumer rank"),
    "train_minibatch_size": (CC, "prompts per gradient-accumulation chunk; divides train_batch_size"),
    "train_dataset_config": (CC, "the prompts, as ColossalChat's RawConversationDataset reads them: 'path': a .jsonl "
                                 "of {'messages': {'role', 'content'}, 'gt_answer' or 'test_cases'} lines, each "
                                 "prompt the tokenizer's chat template (with the generation prompt) of [system "
                                 "message, the message]; 'system_prompt': that system message's text (None: "
                                 "ColossalChat's default think/answer-tags math prompt, "
                                 "coati_relay.rewards.system_prompts.DEFAULT_SYSTEM_PROMPT); 'max_length': prompt "
                                 "tokens kept, the FIRST ones (an over-long prompt loses its end; extension: 512 when "
                                 "not given, where ColossalChat requires it). A tokenizer without a chat template is "
                                 "an error (ColossalChat's apply_chat_template fails too). Prompts are left-padded, "
                                 "to the longest prompt of each generate call rather than to max_length (the padded "
                                 "columns are masked: the same tokens come out). Extensions: 'messages' as a list "
                                 "(a system message of its own is kept); 'path' to a .csv with a 'prompt' column, or "
                                 "'prompts': a list of strings or of jsonl-style dicts, both with no system message "
                                 "unless 'system_prompt' is given, raw text without the chat template"),
    "inference_model_config": (CC, "the producers' model: {'path': a local model directory or a Hugging Face Hub "
                                   "ID such as 'Qwen/Qwen2.5-7B', resolved once through the Hugging Face cache "
                                   "before any actor starts (downloaded only when HF_HUB_OFFLINE is not set)}, plus "
                                   "the inference engine's keywords ('checkpoint_path': as resume_from)"),
    "generate_config": (CC, "sampling, each key with the meaning of the backend in use, as ColossalChat hands the "
                            "dict to transformers' generate() or vllm.SamplingParams; 'temperature' and 'top_p' are "
                            "required (extension: 1.0 each for core_algo='PPO'). Both backends: max_new_tokens or "
                            "max_tokens, temperature, top_k, top_p, seed, ignore_eos, stop_token_ids. transformers: "
                            "do_sample, max_length (left-padded prompt plus response), stop_strings, early_stopping, "
                            "num_beams=1, use_cache; its other generate() keys are an error (the engine decodes with "
                            "its own loop). vllm: every SamplingParams keyword (stop, include_stop_str_in_output, "
                            "min_tokens, repetition_penalty, ...) is passed on, but n (num_generations sets it) and "
                            "logprobs (always 0), which have no effect, and those that shape the engine's output "
                            "(detokenize, output_kind, ...). A key the backend in use does not know is an error "
                            "naming the backend that knows it (coati_relay.inference.generate_keys)"),
    "train_model_config": (CC, "the trained policy: {'path' (a directory or Hub ID; default: the inference model's), "
                               "'lora': {'r', 'alpha', 'target_modules', 'dropout'}, 'gradient_checkpointing', "
                               "'checkpoint_path' (as resume_from; None: afresh), and from_pretrained's "
                               "'torch_dtype', 'use_cache', 'use_flash_attention_2' (flash attention where CUDA and "
                               "flash-attn are), 'attn_implementation', 'trust_remote_code'}"),
    "grpo_config": (CC, "the algorithm's settings: algo (the advantage estimator; default core_algo), lr, beta, "
                        "clip_eps_low/high, loss_variation, filter_range, dynamic_batching, "
                        "filter_truncated_response, soft_over_length_punishment, cache_length, max_new_tokens, "
                        "train_microbatch_size, reward_fn_type (required: 'think_answer_tags', 'boxed', 'code' with "
                        "code_verifier_api_url; extension: a registered name), response_format_tags; extensions: "
                        "reward_fn (a registered name or a callable), policy_loss, value_loss, kl_estimator "
                        "(registered names) and the other keys of coati_relay.config.algorithm"),
    "plugin_config": (CC, "HybridParallelPlugin's options over ColossalChat's defaults tp_size=1, pp_size=1, "
                          "precision='bf16', zero_stage=2 ('max_norm': gradient clipping); without CUDA "
                          "TorchDDPPlugin in fp32 runs instead, and tp/pp > 1 run as as many data-parallel "
                          "consumers as ColossalChat's data-parallel size, each after one warning. Extension: "
                          "'plugin': 'ddp', 'zero2', 'gemini' or 'hybrid' picks a plugin with its own options"),
    "tokenizer_config": (CC, "{'path': a directory or Hub ID (default: the inference model's), and keywords of "
                             "AutoTokenizer.from_pretrained}"),
    "inference_backend": (CC, "'vllm' or 'transformers' (generate; the fallback, and the legacy sampling)"),
    "num_generations": (CC, "responses sampled per prompt (the group of GRPO's advantages)"),
    "core_algo": (CC, "the consumer: 'GRPO', 'DAPO', 'RLOO', 'REINFORCE_PPB' (one consumer; grpo_config['algo'] "
                      "picks the advantage, default core_algo) or 'PPO' (extension: with a critic)"),
    "project_name": (CC, "the trackers' project (W&B's, as given) and the run's name: default run directory "
                         "runs/NAME with spaces as '_' (extension: None is 'coati-relay')"),
    "save_interval": (CC, "checkpoint after every save_interval-th round (weight version) of each episode and "
                          "after each episode's last round"),
    "save_dir": (CC, "where checkpoints go (save_dir/checkpoints/step-NNNNNN, NNNNNN the global round); default "
                     "'./model', or run_dir where run_dir is given"),
    "master_addr": (CC, "accepted as in ColossalChat, whose launcher passes consumer rank 0's node IP instead; so "
                        "does this engine"),
    "master_port": (CC, "the port on consumer rank 0's node where the consumers' process group meets (a free one, "
                        "after a warning, when it is taken)"),
    "enable_profiling": (CC, "record each role's phase timings per round (run_dir/profile/*.jsonl) and a torch "
                             "profiler trace of consumer rank 0's first rounds (coati_relay.observe.profiling)"),
    "eval_dataset_config": (CC, "evaluation during training: {task name: a dataset config like "
                                "train_dataset_config ('path' or 'prompts', 'max_length', 'system_prompt')}; each "
                                "prompt needs a 'gt_answer' for the math rewards. Producers evaluate their share of "
                                "every task (prompt i to producer i % num_producers) before working with weights "
                                "whose optimizer step is due, and a sample is correct as the run's reward judges it "
                                "in ColossalChat's eval mode (the answer, whatever the format; any other reward: "
                                "reward > 0). None: no evaluation"),
    "eval_interval": (CC, "optimizer steps (ColossalChat's consumer_global_step: weight version times optimizer "
                          "steps per round) between evaluations; the first is at the run's first weights (step 0, "
                          "or the resumed step). <= 0: no evaluation. Default 100"),
    "eval_save_dir": (CC, "where each evaluation's per-sample records go, one JSON object a line with prompt, "
                          "prediction, gold, parsed, format_valid, ans_valid, response_length, reward: "
                          "eval_save_dir/{task}_training_step_{step}.jsonl; it must not hold files already unless "
                          "the run resumes. Accuracy also goes to metrics.jsonl and the trackers as 'eval/{task}' "
                          "(with 'eval/{task}/samples' and 'eval/training_step') at the run's step, and to the "
                          "callbacks' on_evaluate. Default run_dir/eval (ColossalChat's launch_distributed had none)"),
    "eval_generation_config": (CC, "overrides of generate_config for evaluation, which otherwise samples as "
                                   "training does with n=1: generate_config's keys plus 'n' (responses per "
                                   "prompt); temperature 0 is greedy"),
    "log_rollout_interval": (CC, "producer 0 appends a rollout (its prompts, the first response to each and its "
                                 "reward) to the rollout log every this many optimizer steps, first at its first "
                                 "rollout; <= 0: every rollout; None (extension): no log. Default 20"),
    "rollout_save_dir": (CC, "where the rollout log goes: rollout_save_dir/{project_name}_run_{uuid}.jsonl, one "
                             "JSON object a line: train_step, rollout (prompt and response decoded together; "
                             "ColossalChat's fields), prompts, responses, rewards, weight_version. Default "
                             "run_dir/rollout (ColossalChat: ./rollout)"),
    "n_behind": (CC, "staleness bound: 0 is on-policy lock-step; k > 0 allows rollouts made by weights up to k "
                     "versions old"),
    "critic_model_config": (EXT, "PPO's critic: {'path': a directory or Hub ID} (default: a value head on a copy "
                                 "of the policy)"),
    "reward_model_config": (EXT, "a reward model scoring responses instead of reward_fn: {'path': a directory or "
                                 "Hub ID}"),
    "run_dir": (EXT, "where metrics.jsonl, tracker files and (by default) checkpoints go; default runs/PROJECT"),
    "resume_from": (EXT, "a checkpoint directory (run_dir/checkpoints/step-NNNNNN) or a run directory (its latest "
                         "checkpoint) to continue from; num_episodes still counts the whole run"),
    "on_producer_failure": (EXT, "'fail' (a dead producer ends the run) or 'continue' (its tasks go to the others)"),
    "timeout_s": (EXT, "seconds any blocking wait may take before the run fails, naming what it waited for"),
    "seed": (EXT, "seeds sampling, data order and initialisation"),
    "progress": (EXT, "show a progress bar on a terminal, otherwise one line per step on stderr (step, reward, loss, "
                      "KL, samples/s, ETA), and a summary at the end; False: silent"),
    "export_dir": (EXT, "where the final policy is exported as a Hugging Face model (save_pretrained); default "
                        "True: run_dir/hf_model; False or None: no export"),
    "weight_sync": (EXT, "'object_store' (one copy per version, fetched by each producer) or 'collective' (a gloo "
                         "broadcast from consumer rank 0)"),
    "placement_strategy": (EXT, "the Ray placement group's strategy: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD"),
    "placement_timeout_s": (EXT, "seconds to wait for the cluster to hold every role"),
    "role_resources": (EXT, "custom Ray resources per role: {'producer': {...}, 'consumer': {...}}"),
    "colocate": (EXT, "one producer and one consumer in the driver's process, sharing the policy, without Ray"),
    "report_to": (EXT, "trackers besides metrics.jsonl: a list of 'tensorboard', 'wandb' or 'none'"),
    "callbacks": (EXT, "objects with hook methods on_run_start(config), on_round_end(step, metrics), "
                       "on_checkpoint(step, path), on_evaluate(step, results) (after each evaluation, with "
                       "the record written to metrics.jsonl), on_run_end(result), called in the driver in list "
                       "order; on_round_end may raise coati_relay.StopRun to end the run there with a "
                       "checkpoint (coati_relay.callbacks)"),
}


# The zero-bubble entry (`coati_relay.launch_zero_bubble.launch_distributed`, ColossalChat's
# ``coati.distributed.launch_zero_bubble``): its own keyword, and the one whose default differs there.
ZERO_BUBBLE_KEYWORDS: Dict[str, Tuple[str, str]] = {
    "n_behind": ("extension here; ColossalChat's zero-bubble entry has no such keyword",
                 "staleness bound, meant as in launch_distributed: an int k >= 0 trains only on rollouts made by "
                 "weights at most k versions old (staler ones are made again) and makes producers wait for such "
                 "weights; None, the default, bounds staleness by the data buffer alone, as ColossalChat does"),
    "data_actor_buffer_size_limit": (CC, "the data buffer, in prompts: a producer claims its next micro-batch "
                                         "(inference_microbatch_size prompts) only while fewer than this many "
                                         "prompts are claimed by producers or queued for the consumers, and waits "
                                         "otherwise; <= 0, the default: 2 * train_minibatch_size * "
                                         "num_consumer_procs"),
}


def keywords_doc(head: str, ignored: Mapping[str, str], skip: Iterable[str] = (), width: int = 116,
                 overrides: Mapping[str, Tuple[str, str]] = None) -> str:
    """``head`` followed by one paragraph per keyword but those in ``skip`` (and the ColossalChat keywords accepted
    without effect). ``overrides``: keyword -> (origin, meaning) replacing or adding to `LAUNCH_KEYWORDS`."""
    lines = [inspect.cleandoc(head), "", "Keywords:"]
    for name, (origin, meaning) in {**LAUNCH_KEYWORDS, **(overrides or {})}.items():
        if name in skip:
            continue
        lines += textwrap.wrap(f"{name} ({origin}): {meaning}.", width=width, initial_indent="    ",
                               subsequent_indent="        ")
    lines += ["", "Accepted for ColossalChat scripts, without effect here (each warns once):"]
    for name, reason in ignored.items():
        lines += textwrap.wrap(f"{name}: {reason}.", width=width, initial_indent="    ",
                               subsequent_indent="        ")
    return "\n".join(lines) + "\n"
