"""``coati-relay compare`` on the legacy examples with tiny models: the report's files and numbers, the verdict on a
migrated run given another learning rate, and a four-role script the rewriter cannot fully translate (exit 3) whose
reward rises on both sides; on reward, a migrated run that learns reads better than one at lr 1e-7 that does not,
and a second run of one process reads same."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from legacy_reward import fit_plain_text_reward_model
from run_helpers import rose

from coati_compat.compare.verdicts import BETTER, NOT_COMPARED, SAME, WORSE, curve_verdict
from coati_relay.toy import build_tiny_model, write_toy_dataset

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "legacy"
STEPS = 3
LEARNING_STEPS = 20  # the four-role script with a trained reward model: enough for the reward to rise
TRANSFORMERS = "--inference_backend transformers"  # the migrated side's sampler, as the legacy makers' above
MANY_ROLES = ["--num_makers", 2, "--num_trainers", 2, "--model", "llama", "--critic_model", "llama",
              "--experience_steps", STEPS, "--experience_batch_size", 2, "--train_batch_size", 2, "--update_steps", 1,
              "--prompt_tokens", 32, "--max_length", 48]


def compare(script: str, options, script_args, cwd: Path):
    """``coati-relay compare`` in a fresh process; returns (exit status, output, compare.json)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "COATI_RELAY_CPU_MODE")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE="1", COATI_RELAY_MAKER_SAMPLER="transformers")  # no vLLM start: faster here
    cli = shutil.which("coati-relay", path=os.path.dirname(sys.executable))
    proc = subprocess.run([cli, "compare", str(EXAMPLES / script), *map(str, options), "--", *map(str, script_args)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    output = proc.stdout + proc.stderr
    out = cwd / options[options.index("--out") + 1]
    data = json.loads((out / "compare.json").read_text()) if (out / "compare.json").is_file() else None
    return proc.returncode, output, data


def verdicts(data):
    return {v["quantity"]: v["verdict"] for v in data["verdicts"]}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_toy_dataset(tmp_path_factory.mktemp("data") / "prompts.csv", num_prompts=32, fmt="csv")


@pytest.fixture(scope="module")
def many_roles(tmp_path_factory, prompts):
    """ppo_many_roles: two legacy runs and the migrated run, three steps each."""
    cwd = tmp_path_factory.mktemp("compare-many")
    llama = build_tiny_model(arch="llama")
    args = [*MANY_ROLES, "--pretrain", llama, "--critic_pretrain", llama, "--prompt_path", prompts]
    status, output, data = compare("ppo_many_roles.py", ["--steps", STEPS, "--out", "report", "--migrated-args",
                                                          TRANSFORMERS], args, cwd)
    assert status == 0, output[-6000:]
    return cwd, args, output, data


def test_many_roles_report(many_roles):
    cwd, _, output, data = many_roles
    out = cwd / "report"
    for name in ("report.md", "compare.json", "compare.png", "migrated_ppo_many_roles.py"):
        assert (out / name).is_file(), name
    assert data["rewriter"]["exit_code"] == 0 and data["steps_budget"] == STEPS
    legacy, migrated = data["legacy"], data["migrated"]
    assert [[r["step"] for r in run["rows"]] for run in legacy] == [[1, 2, 3]] * 2
    assert [r["step"] for r in migrated["rows"]] == [1, 2, 3]
    for rows in [run["rows"] for run in legacy] + [migrated["rows"]]:
        assert all(r["samples"] == 4 for r in rows), "2 trainers x 2 samples; a round of 4 prompts"
        assert all(r["reward"] is not None and r["kl"] is not None and r["actor_loss"] is not None
                   and r["critic_loss"] is not None and r["step_s"] > 0 and r["push_s"] > 0 for r in rows)
    for side in [run["summary"] for run in legacy] + [migrated["summary"]]:
        assert side["steps"] == STEPS and side["samples_per_s"] > 0 and side["peak_memory"] > 0
    assert {"ExperienceMakerHolderImpl", "DetachedPPOTrainerImpl"} <= set(legacy[0]["run"]["peak_memory_mib"])
    assert {"ProducerWorker", "ConsumerWorker"} <= set(migrated["run"]["peak_memory_mib"])
    found = verdicts(data)
    assert set(found.values()) <= {SAME, BETTER, WORSE} and len(found) == 11, found
    assert found["kl"] == SAME, "legacy lr 1e-7 on both sides: no KL on either"
    by_tag = {e["tag"]: e for e in data["explanations"]}
    sampler = next(e for e in by_tag.values() if e["text"].startswith("The maker sampled with the legacy"))
    assert "reward" in sampler["quantities"] and "s_per_step" in sampler["quantities"]
    assert any(e["link"].endswith("#kl-and-advantages") and "kl" in e["quantities"] for e in by_tag.values())
    assert all(not e["quantities"] for e in by_tag.values() if e["link"].endswith("#lora")), "no LoRA in this run"
    report = (out / "report.md").read_text()
    assert "Rule: Per-step curves" in report and "| step | reward L |" in report and sampler["tag"] in report
    assert "report: report/report.md" in output


def test_many_roles_with_another_learning_rate_does_not_read_same(many_roles):
    """The same legacy runs (reused) against a migrated run at lr 0.05: its KL leaves the legacy noise."""
    cwd, args, output, _ = many_roles
    status, output, data = compare("ppo_many_roles.py", ["--steps", STEPS, "--out", "report-lr", "--reuse-legacy",
                                                         "report", "--migrated-args", f"{TRANSFORMERS} --lr 0.05"],
                                   args, cwd)
    assert status == 0, output[-6000:]
    assert data["migrated_args"][-2:] == ["--lr", "0.05"] and len(data["migrated"]["rows"]) == STEPS
    assert not (cwd / "report-lr" / "legacy-1").exists(), "the legacy runs were reused, not run again"
    assert verdicts(data)["kl"] == WORSE
    kl = next(v for v in data["verdicts"] if v["quantity"] == "kl")
    assert kl["difference"] > kl["noise"] > 0


@pytest.fixture(scope="module")
def four_role(tmp_path_factory, prompts):
    """four_role_ppo.py with a trained reward model (``--rm_path``) at lr 3e-2: one legacy run and the migrated run,
    LEARNING_STEPS steps each."""
    cwd = tmp_path_factory.mktemp("compare-four")
    gpt2 = build_tiny_model(cwd / "tiny-gpt2", arch="gpt2", hidden_size=64)
    reward_model = fit_plain_text_reward_model(gpt2, cwd / "rm.pt")
    args = ["--pretrain", gpt2, "--prompt_csv", prompts, "--workers_per_role", 2, "--steps", LEARNING_STEPS,
            "--batch_size", 8, "--new_tokens", 8, "--lr", 3e-2, "--rm_path", reward_model,
            "--save_dir", cwd / "ckpt"]
    status, output, data = compare("four_role_ppo.py", ["--steps", LEARNING_STEPS, "--out", "report",
                                                        "--legacy-runs", 1, "--migrated-args", TRANSFORMERS],
                                   args, cwd)
    assert status == 0, output[-6000:]
    return cwd, args, output, data


def test_four_role_script_learns_on_both_sides(four_role):
    """A four-role script with a trained reward model (``--rm_path``) the rewriter converts: the reward rises on
    both sides; exit 3 of the rewriter (the script's own actor classes), named in the report."""
    cwd, _, _, data = four_role
    assert data["rewriter"]["exit_code"] == 3 and "PolicyWorker" in data["rewriter"]["untranslated"][0]
    report = (cwd / "report" / "report.md").read_text()
    assert "The rewriter could not translate (exit 3)" in report and "PolicyWorker, ValueWorker" in report
    assert (cwd / "rm.pt.relay" / "config.json").is_file(), "the migrated run converted the reward model"
    (legacy,) = data["legacy"]
    migrated = data["migrated"]
    steps = list(range(1, LEARNING_STEPS + 1))
    assert [r["step"] for r in legacy["rows"]] == steps and [r["step"] for r in migrated["rows"]] == steps
    assert all(r["samples"] == 16 and r["reward"] is not None and r["actor_loss"] is not None
               and r["critic_loss"] is not None for r in legacy["rows"]), "two policy ranks x 8 prompts per step"
    for side in (legacy, migrated):
        first, last = rose(side["rows"])
        assert last > first and side["summary"]["reward_slope"] > 0, [r["reward"] for r in side["rows"]]
    assert {"PolicyWorker", "ValueWorker", "ReferenceWorker", "RewardWorker"} <= set(legacy["run"]["peak_memory_mib"])
    found = verdicts(data)
    assert found["push_s"] == NOT_COMPARED, "the script's policy workers sample with the weights they train"
    assert all(found[q] != NOT_COMPARED for q in ("reward", "kl", "actor_loss", "critic_loss", "s_per_step"))
    notes = [e for e in data["explanations"] if e["link"].endswith("#four-role") and "reward" in e["quantities"]]
    assert any("legacy_reward_model" in e["text"] for e in notes), "the reading of the reward model is explained"
    assert any(e["text"].startswith("KL estimate of the maker") for e in data["explanations"]), "compute_reward"


@pytest.fixture(scope="module")
def four_role_still(four_role):
    """The four-role legacy run (reused) against a migrated run at lr 1e-7, which does not learn."""
    cwd, args, _, _ = four_role
    status, output, data = compare("four_role_ppo.py", ["--steps", LEARNING_STEPS, "--out", "report-still",
                                                        "--reuse-legacy", "report",
                                                        "--migrated-args", f"{TRANSFORMERS} --lr 1e-7"], args, cwd)
    assert status == 0, output[-6000:]
    assert data["migrated_args"][-2:] == ["--lr", "1e-7"] and len(data["migrated"]["rows"]) == LEARNING_STEPS
    return data


def test_reward_reads_better_for_a_run_that_learns_and_same_for_another_run_of_its_process(four_role,
                                                                                             four_role_still):
    """The engine's reward and the legacy script's are not on one scale (the converted reward model reads the last
    token where the legacy one averaged the positions: see the four-role explanation), so the reward verdicts
    "better" and "same" are read against the engine's own runs: the lr 1e-7 run above stands as the legacy side
    (an earlier report, ``--reuse-legacy``), and a migrated run at the script's lr 3e-2 learns where it does not
    (better); against the first report's migrated run, a run of that same (seeded) process, it reads same."""
    cwd, args, _, first = four_role
    still = dict(four_role_still, legacy=[four_role_still["migrated"]])
    (cwd / "engine-still").mkdir()
    (cwd / "engine-still" / "compare.json").write_text(json.dumps(still))
    status, output, data = compare("four_role_ppo.py", ["--steps", LEARNING_STEPS, "--out", "report-learns",
                                                        "--reuse-legacy", "engine-still", "--migrated-args",
                                                        TRANSFORMERS], args, cwd)
    assert status == 0, output[-6000:]
    assert [r["step"] for r in data["migrated"]["rows"]] == list(range(1, LEARNING_STEPS + 1))
    reward = next(v for v in data["verdicts"] if v["quantity"] == "reward")
    assert reward["verdict"] == BETTER and reward["difference"] > reward["noise"] > 0, reward

    again = curve_verdict("reward", [[r["reward"] for r in first["migrated"]["rows"]]],
                          [r["reward"] for r in data["migrated"]["rows"]], "higher")
    assert again.verdict == SAME, again
