"""``coati-relay migrate --target colossalchat``: the helpers the written script carries, its NOTEs, the CLI, and
that the engine accepts the written call (its checks only; `tests/e2e/test_colossalchat_migration_run.py` trains)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from coati_compat.migrate import migrate_file
from coati_compat.migrate.cli import EXIT_BAD_INPUT, EXIT_OK, main
from coati_compat.migrate.emitted_colossalchat import (
    LEGACY_STRATEGY_HYBRID,
    SYSTEM_PROMPTS,
    colossalchat_generate_config,
    colossalchat_grpo_config,
    prompts_jsonl_path,
    system_prompt,
    write_prompts_jsonl,
)

ROOT = Path(__file__).resolve().parents[3]
LEGACY = ROOT / "examples" / "legacy"


def test_prompt_csv_becomes_colossalchat_jsonl_beside_it(tmp_path):
    csv_path = tmp_path / "prompts.csv"
    csv_path.write_text('prompt,gt_answer,other\n"Say a, then b",a,x\nWhat is 2+2?,4,y\n', encoding="utf-8")
    out = write_prompts_jsonl(str(csv_path))
    assert out == str(tmp_path / "prompts.colossalchat.jsonl") == prompts_jsonl_path(str(csv_path))
    lines = [json.loads(line) for line in Path(out).read_text().splitlines()]
    assert lines == [{"messages": {"role": "user", "content": "Say a, then b"}, "gt_answer": "a"},
                     {"messages": {"role": "user", "content": "What is 2+2?"}, "gt_answer": "4"}]
    stamp = os.path.getmtime(out)
    assert write_prompts_jsonl(str(csv_path)) == out and os.path.getmtime(out) == stamp, "not rewritten when current"
    jsonl = tmp_path / "given.jsonl"
    jsonl.write_text(lines and json.dumps(lines[0]) + "\n")
    assert write_prompts_jsonl(str(jsonl)) == str(jsonl) == prompts_jsonl_path(str(jsonl))


def test_prompt_csv_without_answers_is_refused_with_the_fix(tmp_path):
    bare = tmp_path / "bare.csv"
    bare.write_text("prompt\nhello\n")
    with pytest.raises(ValueError, match=r"no 'gt_answer' column.*--answer_column"):
        write_prompts_jsonl(str(bare))
    assert write_prompts_jsonl(str(bare), answer_column="prompt").endswith("bare.colossalchat.jsonl")
    empty = tmp_path / "empty.csv"
    empty.write_text("prompt,gt_answer\nhello,\n")
    with pytest.raises(ValueError, match=r"empty.csv:2: empty prompt or 'gt_answer'"):
        write_prompts_jsonl(str(empty))
    with pytest.raises(FileNotFoundError, match="--prompt_path"):
        write_prompts_jsonl(str(tmp_path / "missing.csv"))


def test_generate_config_takes_the_backends_keys():
    assert colossalchat_generate_config("vllm", 32, top_k=50) == {"temperature": 1.0, "top_p": 1.0,
                                                                  "max_tokens": 32, "top_k": 50}
    assert colossalchat_generate_config("transformers", 32, temperature=0.7, top_p=0.9) == {
        "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 32, "do_sample": True, "top_k": 0}
    assert colossalchat_generate_config("vllm", 8)["top_k"] == -1
    with pytest.raises(ValueError, match="unknown inference backend 'sglang'"):
        colossalchat_generate_config("sglang", 8)


def test_grpo_config_names_the_algorithm_and_dapo_brings_its_settings():
    grpo = colossalchat_grpo_config("RLOO", 1e-6, 0.05, "boxed", 64, clip_eps=0.3)
    assert grpo == {"algo": "RLOO", "lr": 1e-6, "beta": 0.05, "loss_variation": "sample_level",
                    "reward_fn_type": "boxed", "max_new_tokens": 64, "clip_eps_low": 0.3, "clip_eps_high": 0.3}
    dapo = colossalchat_grpo_config("DAPO", 1e-6, 0.05, "think_answer_tags", 64)
    assert dapo["beta"] == 0.0 and dapo["loss_variation"] == "token_level" and dapo["cache_length"] == 16
    assert (dapo["clip_eps_low"], dapo["clip_eps_high"], dapo["filter_range"]) == (0.2, 0.28, [0.01, 0.99])
    assert colossalchat_grpo_config("DAPO", 1e-6, 0.0, "boxed", 2)["cache_length"] == 1


def test_legacy_strategies_become_hybrid_parallel_configs():
    assert LEGACY_STRATEGY_HYBRID["ddp"] == LEGACY_STRATEGY_HYBRID["naive"] == {
        "tp_size": 1, "pp_size": 1, "zero_stage": 0, "precision": "fp32"}
    assert LEGACY_STRATEGY_HYBRID["colossalai_zero2"] == {"tp_size": 1, "pp_size": 1, "zero_stage": 2,
                                                          "precision": "fp16"}
    assert LEGACY_STRATEGY_HYBRID["colossalai_zero2_cpu"]["cpu_offload"] is True
    gemini = LEGACY_STRATEGY_HYBRID["colossalai_gemini_cpu"]
    assert gemini["zero_stage"] == 2 and gemini["initial_scale"] == 32 and gemini["cpu_offload"] is True


def test_system_prompt_asks_for_the_rewards_format():
    assert "<answer>" in system_prompt("think_answer_tags") and "boxed" in system_prompt("boxed")
    assert system_prompt("boxed", "Be brief.") == "Be brief."
    with pytest.raises(ValueError, match="--system_prompt"):
        system_prompt("code")
    assert set(SYSTEM_PROMPTS) == {"think_answer_tags", "boxed"}


@pytest.mark.parametrize("name", ["ppo_many_roles.py", "dummy_throughput.py", "custom_trainer.py",
                                  "four_role_ppo.py"])
def test_written_script_says_what_changes_when_ppo_becomes_grpo(name):
    m = migrate_file(LEGACY / name, target="colossalchat")
    topics = {n.topic for n in m.notes}
    assert {"ppo-to-grpo", "rewards", "dataset", "generation", "batch-sizes", "trainer-strategy"} <= topics
    head = m.script[:m.script.index("def ")]
    assert "# NOTE: PPO becomes core_algo=--algo (GRPO by default)" in head and "no counterpart" in head
    assert "critic" in next(n.text for n in m.notes if n.topic == "ppo-to-grpo")
    assert not any("RunResult.history or run_dir" in n.text for n in m.notes), "engine-only advice left over"
    assert max(len(line) for line in m.script.splitlines()) <= 120
    assert not re.search(r"^\s*(from|import) coati_compat", m.script, re.M)
    if name == "ppo_many_roles.py":
        assert '"--critic_pretrain", help=' in m.script, "an unused legacy flag is no longer required"


def test_lora_and_reward_model_helpers_are_left_out():
    m = migrate_file(LEGACY / "four_role_ppo.py", target="colossalchat")
    assert "def lora_config" not in m.script and "def legacy_reward_model" not in m.script
    kw = m.launch_kwargs({"pretrain": "/m", "prompt_csv": "p.csv", "rm_path": "/rm.pt", "lora_rank": 4})
    assert kw["train_model_config"] == {"path": "/m"} and kw["train_dataset_config"]["path"] == "p.colossalchat.jsonl"
    assert any(n.topic == "lora" and "trains fully" in n.text for n in m.notes)


def test_cli_target_writes_colossalchat_and_refuses_yaml(tmp_path, capsys):
    out = tmp_path / "cc.py"
    assert main([str(LEGACY / "ppo_many_roles.py"), "--target", "colossalchat", "-o", str(out)]) == EXIT_OK
    assert "from coati.distributed.launch import launch_distributed" in out.read_text()
    assert main([str(LEGACY / "ppo_many_roles.py"), "--target", "colossalchat", "--yaml",
                 str(tmp_path / "c.yaml")]) == EXIT_BAD_INPUT
    assert "--target coati_relay" in capsys.readouterr().err and not (tmp_path / "c.yaml").exists()


@pytest.mark.parametrize("algo", ["GRPO", "DAPO", "RLOO", "REINFORCE_PPB"])
def test_engine_accepts_the_written_call(algo, tiny_model_path, tmp_path):
    """The engine's checks (no actors) pass on the colossalchat target's keywords, every algorithm, both backends."""
    from coati_relay.assembly.build import build_run_config
    from coati_relay.toy import write_toy_dataset

    csv_path = write_toy_dataset(tmp_path / "prompts.csv", num_prompts=32, fmt="csv")
    m = migrate_file(LEGACY / "ppo_many_roles.py", target="colossalchat")
    for backend in ("vllm", "transformers"):
        flags = {"pretrain": tiny_model_path, "critic_pretrain": tiny_model_path, "prompt_path": str(csv_path),
                 "prompt_tokens": 96, "max_length": 112, "num_generations": 2, "inference_backend": backend,
                 "algo": algo}
        write_prompts_jsonl(str(csv_path))
        cfg = build_run_config(**m.launch_kwargs(flags))
        assert cfg.core_algo == algo and cfg.data.num_prompts == 32 and cfg.sampling.max_new_tokens == 16
        assert cfg.data.system_prompt == SYSTEM_PROMPTS["think_answer_tags"]
