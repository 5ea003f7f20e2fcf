"""The verdict of a comparison, per quantity: *same within noise*, *better* or *worse*.

The noise is measured on the legacy side: the script runs twice (or more), and its runs differ only by their random
streams (sampling, shuffling). `RULE` is the rule, word for word as the report states it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

SAME, BETTER, WORSE, NOT_COMPARED = "same within noise", "better", "worse", "not compared"
REL_FLOOR = 0.10  # the smallest noise band: 10% of the legacy level ...
ABS_FLOOR = 1e-6  # ... and never below this (a KL of 1e-9 against 0 is no difference)

RULE = (
    "Per-step curves (reward, KL, actor loss, critic loss), over the steps both sides made: d = mean over steps of "
    "(migrated - mean of the legacy runs); noise = mean over steps of the spread (max - min) of the legacy runs "
    "(with one legacy run: the RMS of its residuals around its least-squares line). Scalars (s/step, samples/s, "
    "whole-run time, weight push, peak memory, final reward, reward slope): d = migrated - mean of the legacy runs; "
    f"noise = the spread of the legacy runs. Either noise is at least {REL_FLOOR:.0%} of the legacy level (mean "
    f"absolute value) and at least {ABS_FLOOR:g}. |d| <= noise reads 'same within noise'; otherwise 'better' or "
    "'worse' by the quantity's direction (higher is better for reward, its slope and samples/s; lower for "
    "everything else).")


@dataclass
class Verdict:
    """One quantity's verdict and the numbers it rests on (legacy: the mean of the legacy runs)."""

    quantity: str
    verdict: str
    legacy: Optional[float] = None
    migrated: Optional[float] = None
    difference: Optional[float] = None
    noise: Optional[float] = None
    better: str = "higher"
    reason: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)


def decide(difference: float, noise: float, better: str) -> str:
    """SAME when ``|difference| <= noise``, else BETTER or WORSE by the direction ``better`` ('higher'/'lower')."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if abs(difference) <= noise:
        return SAME
    return BETTER if (difference > 0) == (better == "higher") else WORSE


def _floor(level: float) -> float:
    return max(REL_FLOOR * abs(level), ABS_FLOOR)


def trend_residual(values: Sequence[float]) -> float:
    """RMS of ``values`` around their least-squares line (0 for fewer than three points)."""
    n = len(values)
    if n < 3:
        return 0.0
    slope = least_squares_slope(values)
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    residuals = [y - (y_mean + slope * (x - x_mean)) for x, y in enumerate(values)]
    return math.sqrt(sum(r * r for r in residuals) / n)


def least_squares_slope(values: Sequence[float]) -> Optional[float]:
    """The slope of the least-squares line through ``(0, v0), (1, v1), ...`` (None for fewer than two points)."""
    n = len(values)
    if n < 2:
        return None
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    sxx = sum((x - x_mean) ** 2 for x in range(n))
    return sum((x - x_mean) * (y - y_mean) for x, y in enumerate(values)) / sxx


def curve_verdict(quantity: str, legacy_runs: Sequence[Sequence[Optional[float]]],
                  migrated: Sequence[Optional[float]], better: str) -> Verdict:
    """The verdict on a per-step curve (see `RULE`); steps where any side has no finite value are left out."""
    if not legacy_runs:
        return Verdict(quantity, NOT_COMPARED, better=better, reason="no legacy run")
    length = min([len(migrated), *map(len, legacy_runs)])
    steps = [t for t in range(length) if _finite(migrated[t]) and all(_finite(run[t]) for run in legacy_runs)]
    if not steps:
        return Verdict(quantity, NOT_COMPARED, better=better, reason="no step where both sides have this number")
    legacy_mean = [sum(run[t] for run in legacy_runs) / len(legacy_runs) for t in steps]
    difference = sum(migrated[t] - m for t, m in zip(steps, legacy_mean)) / len(steps)
    if len(legacy_runs) > 1:
        noise = sum(max(run[t] for run in legacy_runs) - min(run[t] for run in legacy_runs) for t in steps)
        noise /= len(steps)
    else:
        noise = trend_residual(legacy_mean)
    level = sum(abs(m) for m in legacy_mean) / len(legacy_mean)
    noise = max(noise, _floor(level))
    return Verdict(quantity, decide(difference, noise, better), legacy=sum(legacy_mean) / len(legacy_mean),
                   migrated=sum(migrated[t] for t in steps) / len(steps), difference=difference, noise=noise,
                   better=better, reason=f"over {len(steps)} step(s)")


def scalar_verdict(quantity: str, legacy_values: Sequence[Optional[float]], migrated: Optional[float],
                   better: str) -> Verdict:
    """The verdict on one number per run (see `RULE`)."""
    values: List[float] = [v for v in legacy_values if _finite(v)]
    if not values or not _finite(migrated):
        return Verdict(quantity, NOT_COMPARED, better=better,
                       reason="missing on the legacy side" if not values else "missing on the migrated side")
    legacy = sum(values) / len(values)
    noise = max(max(values) - min(values), _floor(legacy))
    difference = migrated - legacy
    return Verdict(quantity, decide(difference, noise, better), legacy=legacy, migrated=migrated,
                   difference=difference, noise=noise, better=better, reason=f"{len(values)} legacy run(s)")


# (key, label, curve or scalar, direction): the quantities a report judges, in its order.
QUANTITIES = (
    ("reward", "reward (per step)", "curve", "higher"),
    ("kl", "KL (per step)", "curve", "lower"),
    ("actor_loss", "actor loss (per step)", "curve", "lower"),
    ("critic_loss", "critic loss (per step)", "curve", "lower"),
    ("final_reward", "final reward", "scalar", "higher"),
    ("reward_slope", "reward slope (per step)", "scalar", "higher"),
    ("s_per_step", "s/step", "scalar", "lower"),
    ("samples_per_s", "samples/s", "scalar", "higher"),
    ("whole_run_s", "whole-run time (s)", "scalar", "lower"),
    ("push_s", "weight push (s/step)", "scalar", "lower"),
    ("peak_memory", "peak memory (MiB)", "scalar", "lower"),
)


def judge(legacy_rows: Sequence[Sequence[dict]], legacy_summaries: Sequence[dict], migrated_rows: Sequence[dict],
          migrated_summary: dict) -> List[Verdict]:
    """The verdict on every quantity of `QUANTITIES`: curves from the per-step rows, scalars from the summaries."""
    out = []
    for key, label, kind, better in QUANTITIES:
        if kind == "curve":
            verdict = curve_verdict(key, [[r[key] for r in rows] for rows in legacy_rows],
                                    [r[key] for r in migrated_rows], better)
        else:
            verdict = scalar_verdict(key, [s.get(key) for s in legacy_summaries], migrated_summary.get(key), better)
        out.append(verdict)
    return out
