"""The report of ``coati-relay compare`` from a synthetic comparison: tables, verdict lines with their rule, the
deviations beside the numbers, and what it says about untranslated parts, identical legacy runs and failures."""
from __future__ import annotations

import json

from coati_compat.compare import report
from coati_compat.compare.verdicts import RULE, judge


def rows(rewards, push=0.1):
    return [{"step": t, "reward": r, "reward_std": 0.01, "kl": 0.01 * t, "actor_loss": 0.5, "critic_loss": 0.2,
             "samples": 4, "step_s": 1.0, "samples_per_s": 4.0, "push_s": push} for t, r in enumerate(rewards, 1)]


def run(ok=True):
    return {"returncode": 0 if ok else 1, "ok": ok, "timed_out": False, "log": "side/log.txt", "wall_s": 30.0,
            "peak_memory_mib": {"driver": 300.0, "PolicyWorker": 400.0}, "total_peak_memory_mib": 1200.0}


def comparison(legacy_rewards, migrated_rewards, untranslated=(), migrated_ok=True):
    summary = {"final_reward": 0.3, "reward_slope": 0.1, "s_per_step": 1.0, "samples_per_s": 4.0,
               "whole_run_s": 30.0, "push_s": 0.1, "peak_memory": 1200.0}
    legacy = [{"run": run(), "rows": rows(r), "summary": summary} for r in legacy_rewards]
    migrated = {"run": run(migrated_ok), "rows": rows(migrated_rewards), "summary": summary}
    judged = judge([x["rows"] for x in legacy], [x["summary"] for x in legacy], migrated["rows"], summary)
    return {"script": "scripts/train.py", "args": ["--lr", "1"], "steps_budget": 3, "cuda": False,
            "migrated_args": [], "rewriter": {"exit_code": 3 if untranslated else 0, "error": None,
                                              "untranslated": list(untranslated), "migrated_script": "x.py"},
            "legacy": legacy, "migrated": migrated, "migrated_skipped": None, "rule": RULE,
            "verdicts": [v.to_json() for v in judged],
            "explanations": [{"tag": "N1", "text": "GAE instead of r - V.", "link": "rewriter.md#kl-and-advantages",
                              "quantities": ["kl", "reward"]},
                             {"tag": "N2", "text": "no routing.", "link": "rewriter.md#routing", "quantities": []}]}


def test_report_files_and_content(tmp_path):
    data = comparison([[0.1, 0.2, 0.3], [0.15, 0.25, 0.3]], [0.1, 0.2, 0.35])
    text = report.write_report(tmp_path, data)
    assert (tmp_path / "report.md").read_text() == text
    assert json.loads((tmp_path / "compare.json").read_text())["steps_budget"] == 3
    assert (tmp_path / "compare.png").stat().st_size > 1000
    assert "| 2 | 0.225 | 0.05 | 0.01 | 0.2 |" in text, "reward L (mean of runs), spread, std, reward M"
    assert "- reward (per step): **same within noise**" in text and "explained by N1" in text
    assert f"Rule: {RULE}" in text
    assert "**N1** (rewriter.md#kl-and-advantages): GAE instead of r - V. Explains: KL (per step), reward" in text
    assert "NOTEs that explain no measured number:" in text and "- N2 (rewriter.md#routing)" in text
    assert "| PolicyWorker | 400 | 400 |" in text
    assert "could not translate" not in text and "step for step" not in text
    assert "The legacy runs made" not in text, "they made the whole budget"


def test_a_legacy_run_shorter_than_the_budget_says_how_to_make_it_longer(tmp_path):
    data = {**comparison([[0.1, 0.2, 0.3]] * 2, [0.1, 0.2, 0.3]), "steps_budget": 20}
    text = report.render(data)
    assert ("The legacy runs made 3 of the 20 steps `--steps` allows, so the migrated side ran 3: a legacy script sets "
            "its own length from its arguments") in text
    assert "give the script a longer run's arguments after `--`" in text


def test_report_says_what_stopped_the_rewriter_and_which_run_failed(tmp_path):
    data = comparison([[0.1, 0.2, 0.3]] * 2, [0.1, 0.2], untranslated=["the custom trainer class"],
                      migrated_ok=False)
    text = report.render(data)
    assert "The rewriter could not translate (exit 3):\n\n- the custom trainer class" in text
    assert "same rewards step for step" in text
    assert "**The migrated run failed** (exit 1); its log: `side/log.txt`" in text
    data.update(migrated=None, migrated_skipped="the rewriter wrote no script: no legacy actors.")
    text = report.render(data)
    assert "**The migrated side did not run:** the rewriter wrote no script" in text and "| 3 | 0.3 |" in text
