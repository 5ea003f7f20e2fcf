"""Tables and functions the rewriter copies, verbatim, into scripts migrated with ``--target colossalchat``.

They write ColossalChat's own configuration (``coati.distributed`` at ColossalAI 4f9953be3): a migrated script must
run there unchanged, so it depends on nothing but the standard library. ``tests/unit/compat/
test_colossalchat_contract.py`` binds what they return to ColossalChat's signature and config keys.
"""
from __future__ import annotations

import csv
import json
import os

# The system prompt per reward type: it asks for the answer format that reward's verifier checks (ColossalChat's
# rl_example.py picks one per reward type the same way; the wording here is ours).
SYSTEM_PROMPTS = {
    "think_answer_tags": "First think about the question, then answer it. Write your reasoning between <think> and "
                         "</think>, then only the final answer between <answer> and </answer>, for example: "
                         "<think> reasoning </think><answer> 42 </answer>",
    "boxed": "Reason step by step, and give the final answer inside \\boxed{}.",
}


def system_prompt(reward_type, given=None):
    """train_dataset_config["system_prompt"]: ``given``, else the prompt that asks for ``reward_type``'s format."""
    if given is not None:
        return given
    if reward_type not in SYSTEM_PROMPTS:
        raise ValueError(f"no default system prompt for reward type {reward_type!r}; pass --system_prompt or use "
                         f"one of {sorted(SYSTEM_PROMPTS)}")
    return SYSTEM_PROMPTS[reward_type]


def prompts_jsonl_path(path):
    """The ColossalChat JSONL that train_dataset_config reads: ``path`` itself when it is a .jsonl, else the copy
    `write_prompts_jsonl` makes beside the legacy CSV (``prompts.csv`` -> ``prompts.colossalchat.jsonl``)."""
    root, ext = os.path.splitext(str(path))
    return str(path) if ext.lower() == ".jsonl" else root + ".colossalchat.jsonl"


def write_prompts_jsonl(path, answer_column="gt_answer"):
    """Writes the legacy prompt CSV at ``path`` as ColossalChat's JSONL, one line a prompt:
    ``{"messages": {"role": "user", "content": PROMPT}, "gt_answer": ANSWER}``, at `prompts_jsonl_path` (again
    only when the CSV is newer). A .jsonl is left as it is. Returns the JSONL's path.

    ColossalChat's rewards compare each response with its prompt's ``gt_answer`` and stop the run on a missing or
    empty one, so every row needs the ``answer_column``.
    """
    out = prompts_jsonl_path(path)
    if out == str(path):
        return out
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt file {path} does not exist; pass --prompt_path with a CSV (a 'prompt' "
                                f"column and an answer column) or a ColossalChat .jsonl")
    if os.path.isfile(out) and os.path.getmtime(out) >= os.path.getmtime(path):
        return out
    lines = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        for needed in ("prompt", answer_column):
            if needed not in columns:
                raise ValueError(f"{path} has no {needed!r} column (columns: {columns}); ColossalChat scores each "
                                 f"response against its prompt's answer: add a column with them, or name it with "
                                 f"--answer_column")
        for row in reader:
            if not (row["prompt"] or "").strip() or not (row[answer_column] or "").strip():
                raise ValueError(f"{path}:{reader.line_num}: empty prompt or {answer_column!r}; ColossalChat "
                                 f"stops on an empty answer, so fill it or drop the row")
            lines.append(json.dumps({"messages": {"role": "user", "content": row["prompt"]},
                                     "gt_answer": row[answer_column]}, ensure_ascii=False))
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return out


def colossalchat_generate_config(backend, max_new_tokens, temperature=1.0, top_k=None, top_p=1.0):
    """generate_config in the keys of the backend that ColossalChat hands it to whole: ``vllm.SamplingParams(
    **config)`` or transformers' ``model.generate(**config)``. ``top_k`` None: no top-k cut (vLLM -1,
    transformers 0), as the legacy sampler without top_k."""
    config = {"temperature": temperature, "top_p": top_p}
    if backend == "vllm":
        config.update(max_tokens=max_new_tokens, top_k=-1 if top_k is None else top_k)
    elif backend == "transformers":
        config.update(max_new_tokens=max_new_tokens, do_sample=True, top_k=0 if top_k is None else top_k)
    else:
        raise ValueError(f"unknown inference backend {backend!r}; use 'vllm' or 'transformers'")
    return config


def colossalchat_grpo_config(algo, lr, kl_coef, reward_type, max_new_tokens, clip_eps=None):
    """grpo_config for ColossalChat's GRPO-family consumer and reward. ``algo`` picks the advantage (ColossalChat
    reads ``grpo_config["algo"]``, not core_algo); DAPO adds its own settings (token-level loss, clip-higher, no
    KL term, groups of all-equal answers filtered out, soft over-length punishment, truncated responses dropped)."""
    config = {"algo": algo, "lr": lr, "beta": kl_coef, "loss_variation": "sample_level",
              "reward_fn_type": reward_type, "max_new_tokens": max_new_tokens}
    if clip_eps is not None:
        config.update(clip_eps_low=clip_eps, clip_eps_high=clip_eps)
    if algo == "DAPO":
        config.update(beta=0.0, loss_variation="token_level", clip_eps_low=config.get("clip_eps_low", 0.2),
                      clip_eps_high=0.28, filter_range=[0.01, 0.99], soft_over_length_punishment=True,
                      cache_length=max(1, min(1024, max_new_tokens // 4)), filter_truncated_response=True)
    return config


def legacy_hybrid_config(strategy):
    """plugin_config (HybridParallelPlugin's keys) for a legacy strategy name (``ddp``, ``colossalai_zero2``, ...)."""
    if strategy not in LEGACY_STRATEGY_HYBRID:
        raise ValueError(f"unknown legacy trainer strategy {strategy!r}; "
                         f"use one of {sorted(LEGACY_STRATEGY_HYBRID)}")
    return dict(LEGACY_STRATEGY_HYBRID[strategy])


def hybrid_config(config):
    """HybridParallelPlugin's keys for one of the engine's plugin_configs (``{"plugin": "ddp" | "zero2" |
    "gemini", ...}``, from `coati_compat.legacy.tables`): ddp is ZeRO stage 0 in fp32; ZeRO-2 and Gemini are
    ZeRO stage 2 with the strategy's precision and loss scale, CPU offload where the strategy offloaded."""
    plugin = config["plugin"]
    if plugin == "ddp":
        return {"tp_size": 1, "pp_size": 1, "zero_stage": 0, "precision": "fp32"}
    if plugin not in ("zero2", "gemini"):
        raise ValueError(f"no HybridParallelPlugin form for plugin {plugin!r}")
    out = {"tp_size": 1, "pp_size": 1, "zero_stage": config.get("stage", 2) if plugin == "zero2" else 2,
           "precision": config.get("precision", "fp16")}
    if config.get("initial_scale", 2 ** 16) != 2 ** 16:
        out["initial_scale"] = config["initial_scale"]
    if config.get("cpu_offload") or config.get("offload_optim_frac", 0) > 0:
        out["cpu_offload"] = True
    return out


def _hybrid_table():
    from coati_compat.legacy.tables import LEGACY_STRATEGIES, plugin_config

    return {name: hybrid_config(plugin_config(name)) for name in LEGACY_STRATEGIES}


# Legacy --trainer_strategy -> plugin_config in HybridParallelPlugin's keys (written into the migrated script).
LEGACY_STRATEGY_HYBRID = _hybrid_table()
