"""The report of a comparison: ``report.md`` (per-step tables, summary, verdicts with their rule, and the deviations
and NOTEs beside the numbers they explain), ``compare.json`` (everything) and ``compare.png`` (reward and losses
per step of every run)."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Dict, List, Sequence

from coati_compat.compare.verdicts import QUANTITIES

logger = logging.getLogger(__name__)

LABELS = {key: label for key, label, _, _ in QUANTITIES}


def fmt(value: Any) -> str:
    """Four significant digits; ``-`` for a missing number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def tags_for(explanations: Sequence[Dict[str, Any]], quantity: str) -> List[str]:
    """The tags of the deviations and NOTEs (as in ``compare.json``) that explain ``quantity``."""
    return [e["tag"] for e in explanations if quantity in e["quantities"]]


def legacy_mean_rows(legacy: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per step, the mean of every number over the legacy runs that made that step, and the runs' reward spread."""
    runs = [run["rows"] for run in legacy]
    out = []
    for t in range(max((len(r) for r in runs), default=0)):
        present = [r[t] for r in runs if t < len(r)]
        row: Dict[str, Any] = {"step": t + 1}
        for key in present[0]:
            values = [p[key] for p in present if p[key] is not None]
            row[key] = sum(values) / len(values) if values and key != "step" else row.get(key)
        rewards = [p["reward"] for p in present if p["reward"] is not None]
        row["reward_spread"] = max(rewards) - min(rewards) if len(rewards) > 1 else None
        out.append(row)
    return out


def step_tables(comparison: Dict[str, Any]) -> str:
    """Two side-by-side tables per step: behaviour, then time."""
    legacy = legacy_mean_rows(comparison["legacy"])
    migrated = (comparison.get("migrated") or {}).get("rows", [])
    steps = max(len(legacy), len(migrated))

    def cell(rows: List[Dict[str, Any]], t: int, key: str) -> Any:
        return rows[t].get(key) if t < len(rows) else None

    behaviour = [[t + 1, cell(legacy, t, "reward"), cell(legacy, t, "reward_spread"), cell(legacy, t, "reward_std"),
                  cell(migrated, t, "reward"), cell(legacy, t, "kl"), cell(migrated, t, "kl"),
                  cell(legacy, t, "actor_loss"), cell(migrated, t, "actor_loss"), cell(legacy, t, "critic_loss"),
                  cell(migrated, t, "critic_loss")] for t in range(steps)]
    speed = [[t + 1, cell(legacy, t, "samples"), cell(migrated, t, "samples"), cell(legacy, t, "step_s"),
              cell(migrated, t, "step_s"), cell(legacy, t, "samples_per_s"), cell(migrated, t, "samples_per_s"),
              cell(legacy, t, "push_s"), cell(migrated, t, "push_s")] for t in range(steps)]
    return "\n\n".join([
        md_table(["step", "reward L", "L spread", "L std", "reward M", "KL L", "KL M", "actor loss L",
                  "actor loss M", "critic loss L", "critic loss M"], behaviour),
        md_table(["step", "samples L", "samples M", "s L", "s M", "samples/s L", "samples/s M", "push s L",
                  "push s M"], speed)])


def summary_table(comparison: Dict[str, Any]) -> str:
    explanations = comparison["explanations"]
    kinds = {key: kind for key, _, kind, _ in QUANTITIES}
    rows = []
    for v in comparison["verdicts"]:
        key = v["quantity"]
        runs = ("mean over steps" if kinds[key] == "curve"
                else ", ".join(fmt(run["summary"].get(key)) for run in comparison["legacy"]))
        rows.append([LABELS[key], fmt(v["legacy"]), runs, fmt(v["migrated"]), fmt(v["noise"]), v["verdict"],
                     ", ".join(tags_for(explanations, key)) or "-"])
    return md_table(["quantity", "legacy", "legacy runs", "migrated", "noise", "verdict", "explained by"], rows)


def memory_table(comparison: Dict[str, Any]) -> str:
    legacy: Dict[str, float] = {}
    for run in comparison["legacy"]:
        for role, mib in run["run"]["peak_memory_mib"].items():
            legacy[role] = max(legacy.get(role, 0.0), mib)
    migrated = ((comparison.get("migrated") or {}).get("run") or {}).get("peak_memory_mib", {})
    roles = sorted(set(legacy) | set(migrated))
    return md_table(["role (process)", "legacy peak MiB", "migrated peak MiB"],
                    [[r, legacy.get(r), migrated.get(r)] for r in roles])


def verdict_lines(comparison: Dict[str, Any]) -> List[str]:
    lines = []
    for v in comparison["verdicts"]:
        tags = tags_for(comparison["explanations"], v["quantity"])
        why = (f"migrated {fmt(v['migrated'])} vs legacy {fmt(v['legacy'])}: d = {fmt(v['difference'])}, noise "
               f"{fmt(v['noise'])}, {v['reason']}") if v["difference"] is not None else v["reason"]
        lines.append(f"- {LABELS[v['quantity']]}: **{v['verdict']}** ({why})"
                     + (f"; explained by {', '.join(tags)}" if tags else ""))
    return lines


def explanation_lines(comparison: Dict[str, Any]) -> List[str]:
    used = [e for e in comparison["explanations"] if e["quantities"]]
    idle = [e for e in comparison["explanations"] if not e["quantities"]]
    lines = [f"- **{e['tag']}** ({e['link']}): {e['text']} Explains: "
             f"{', '.join(LABELS.get(q, q) for q in e['quantities'])}." for e in used]
    if idle:
        lines += ["", "NOTEs that explain no measured number:", ""]
        lines += [f"- {e['tag']} ({e['link']}): {e['text']}" for e in idle]
    return lines


def header_lines(comparison: Dict[str, Any]) -> List[str]:
    rw = comparison["rewriter"]
    lines = [f"# coati-relay compare: {Path(comparison['script']).name}", "",
             f"Arguments: `{' '.join(comparison['args']) or '(none)'}`; step budget {comparison['steps_budget']}; "
             f"{len(comparison['legacy'])} legacy run(s) ({'with CUDA' if comparison['cuda'] else 'CPU mode'}); "
             f"rewriter exit {rw['exit_code']}."
             + (f" Migrated side only: `{' '.join(comparison['migrated_args'])}`." if comparison["migrated_args"]
                else ""), ""]
    made = max((len(run["rows"]) for run in comparison["legacy"]), default=0)
    if 0 < made < comparison["steps_budget"]:
        lines += [f"The legacy runs made {made} of the {comparison['steps_budget']} steps `--steps` allows, so the "
                  f"migrated side ran {made}: a legacy script sets its own length from its arguments (how many "
                  f"batches its makers make, how many episodes its trainers fit). To compare more steps, give the "
                  f"script a longer run's arguments after `--`.", ""]
    if rw["untranslated"]:
        lines += ["The rewriter could not translate (exit 3):", ""]
        lines += [f"- {text}" for text in rw["untranslated"]]
        lines += ["", "Its script is complete nonetheless (the engine's roles replace those parts), so it ran; read "
                  "the numbers below with these parts in mind.", ""]
    curves = [[r["reward"] for r in run["rows"]] for run in comparison["legacy"]]
    if len(curves) > 1 and curves[0] and all(c == curves[0] for c in curves):
        lines += ["The legacy runs made the same rewards step for step (the script fixes its random seeds), so the "
                  "noise of every verdict is its floor.", ""]
    if comparison.get("migrated_skipped"):
        lines += [f"**The migrated side did not run:** {comparison['migrated_skipped']} The legacy side ran alone.",
                  ""]
    for name, run in [(f"legacy run {i}", r["run"]) for i, r in enumerate(comparison["legacy"], start=1)] + (
            [("migrated run", comparison["migrated"]["run"])] if comparison.get("migrated") else []):
        if not run["ok"]:
            lines += [f"**The {name} failed** (exit {run['returncode']}"
                      + (", timed out" if run["timed_out"] else "") + f"); its log: `{run['log']}`", ""]
    return lines


def render(comparison: Dict[str, Any]) -> str:
    """The whole report as Markdown."""
    from coati_compat.compare.verdicts import RULE

    parts = header_lines(comparison)
    parts += ["## Per step", "", "A step is one weight version (legacy: a trainer episode or one round of the "
              "script's loop; migrated: one engine round). L: mean of the legacy runs; M: migrated.", "",
              step_tables(comparison), "", "## Summary", "", summary_table(comparison), "",
              "## Peak memory per role", "", memory_table(comparison), "", "## Verdicts", ""]
    parts += verdict_lines(comparison)
    parts += ["", f"Rule: {RULE}", "", "## Deviations and NOTEs behind the numbers", ""]
    parts += explanation_lines(comparison) or ["(none)"]
    return "\n".join(parts) + "\n"


def plot(comparison: Dict[str, Any], png: Path) -> Path:
    """Reward (left) and actor/critic loss (right) per step of every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_r, ax_l) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=80)
    sides = [(f"legacy {i}", "tab:blue", r["rows"]) for i, r in enumerate(comparison["legacy"], start=1)]
    if comparison.get("migrated"):
        sides.append(("migrated", "tab:orange", comparison["migrated"]["rows"]))
    for i, (name, color, rows) in enumerate(sides):
        style = dict(color=color, alpha=0.6 if name.startswith("legacy") and i else 1.0, marker=".")
        steps = [r["step"] for r in rows]
        ax_r.plot(steps, [r["reward"] for r in rows], label=name, **style)
        ax_l.plot(steps, [r["actor_loss"] for r in rows], label=f"{name} actor", **style)
        ax_l.plot(steps, [r["critic_loss"] for r in rows], label=f"{name} critic", linestyle="--", **style)
    ax_r.set_title("reward")
    ax_l.set_title("loss")
    for ax in (ax_r, ax_l):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=6)
    fig.suptitle(f"{Path(comparison['script']).name}: legacy vs migrated", fontsize=9)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def write_report(out: Path, comparison: Dict[str, Any]) -> str:
    """Writes ``report.md``, ``compare.json`` and ``compare.png`` into ``out``; returns the report's text."""
    text = render(comparison)
    (out / "report.md").write_text(text, encoding="utf-8")
    (out / "compare.json").write_text(json.dumps(comparison, indent=1), encoding="utf-8")
    plot(comparison, out / "compare.png")
    return text
