"""The verdict rule of ``coati-relay compare`` on synthetic curves: two legacy runs that differ by noise, a migrated
run inside that noise (same), and migrated runs known to differ (better, worse)."""
from __future__ import annotations

import math
import random

import pytest

from coati_compat.compare.verdicts import (
    BETTER,
    NOT_COMPARED,
    SAME,
    WORSE,
    curve_verdict,
    decide,
    judge,
    least_squares_slope,
    scalar_verdict,
    trend_residual,
)


def noisy_ramp(seed: int, steps: int = 20, slope: float = 0.04, sigma: float = 0.05, offset: float = 0.0):
    rng = random.Random(seed)
    return [0.1 + offset + slope * t + rng.gauss(0.0, sigma) for t in range(steps)]


def test_a_third_seed_of_the_same_process_reads_same():
    legacy = [noisy_ramp(1), noisy_ramp(2)]
    same = [curve_verdict("reward", legacy, noisy_ramp(seed), "higher").verdict for seed in range(3, 23)]
    assert same.count(SAME) == len(same)


@pytest.mark.parametrize("offset, better, expected", [(0.3, "higher", BETTER), (-0.3, "higher", WORSE),
                                                      (0.3, "lower", WORSE), (-0.3, "lower", BETTER)])
def test_a_shifted_curve_is_better_or_worse_by_the_direction(offset, better, expected):
    legacy = [noisy_ramp(1), noisy_ramp(2)]
    verdict = curve_verdict("reward", legacy, noisy_ramp(3, offset=offset), better)
    assert verdict.verdict == expected
    assert verdict.difference == pytest.approx(offset, abs=0.05)
    assert verdict.noise < abs(offset)


def test_a_flat_curve_against_a_learning_one_is_worse():
    """A migrated run whose learning rate does not move the model (flat reward) against a legacy one that learns."""
    legacy = [noisy_ramp(1), noisy_ramp(2)]
    flat = noisy_ramp(3, slope=0.0)
    assert curve_verdict("reward", legacy, flat, "higher").verdict == WORSE


def test_noise_is_the_spread_of_the_legacy_runs_with_a_relative_floor():
    verdict = curve_verdict("kl", [[1.0, 1.0], [1.4, 1.2]], [1.2, 1.1], "lower")
    assert verdict.noise == pytest.approx(0.3)  # mean of |1.4-1.0| and |1.2-1.0|
    assert verdict.difference == pytest.approx(0.0)
    identical = curve_verdict("kl", [[1.0, 1.0], [1.0, 1.0]], [1.05, 1.05], "lower")
    assert identical.noise == pytest.approx(0.1) and identical.verdict == SAME  # 10% of the level
    assert curve_verdict("kl", [[1.0, 1.0], [1.0, 1.0]], [1.2, 1.2], "lower").verdict == WORSE
    tiny = curve_verdict("kl", [[0.0, 0.0], [0.0, 2e-9]], [0.0, 0.0], "lower")
    assert tiny.noise == pytest.approx(1e-6) and tiny.verdict == SAME, "an absolute floor"


def test_one_legacy_run_takes_its_residuals_around_its_trend_as_noise():
    """One legacy run [0, 2, 1, 3]: its least-squares line is 0.3 + 0.8 t, residuals -0.3, 0.9, -0.9, 0.3, RMS
    sqrt(1.8 / 4) = 0.6708 above the 10% floor (0.15): the noise. A migrated run 0.6 above reads same, 0.7 better."""
    run = [0.0, 2.0, 1.0, 3.0]
    verdict = curve_verdict("reward", [run], [v + 0.6 for v in run], "higher")
    assert verdict.noise == pytest.approx(math.sqrt(0.45))
    assert verdict.difference == pytest.approx(0.6) and verdict.verdict == SAME
    assert curve_verdict("reward", [run], [v + 0.7 for v in run], "higher").verdict == BETTER
    assert curve_verdict("reward", [run], [v - 0.7 for v in run], "higher").verdict == WORSE
    # Residuals -0.02, 0.06, -0.06, 0.02 around 1.02 + 0.02 t (RMS 0.0447) fall under the floor: 10% of 1.05.
    assert curve_verdict("reward", [[1.0, 1.1, 1.0, 1.1]], [1.0] * 4, "higher").noise == pytest.approx(0.105)
    noisy = noisy_ramp(1, sigma=0.05)
    assert curve_verdict("reward", [noisy], noisy_ramp(2, sigma=0.05), "higher").verdict == SAME
    assert curve_verdict("reward", [noisy], noisy_ramp(2, offset=0.5), "higher").verdict == BETTER


def test_trend_residual_off_a_line():
    """[0, 2, 1, 3]: line 0.3 + 0.8 t (slope 4 / 5), residuals -0.3, 0.9, -0.9, 0.3, RMS sqrt(0.45)."""
    assert least_squares_slope([0.0, 2.0, 1.0, 3.0]) == pytest.approx(0.8)
    assert trend_residual([0.0, 2.0, 1.0, 3.0]) == pytest.approx(math.sqrt(0.45))
    assert trend_residual([1.0, 1.1, 1.0, 1.1]) == pytest.approx(math.sqrt(0.008 / 4))
    assert trend_residual([5.0, 7.0]) == 0.0, "fewer than three points"


def test_steps_missing_on_a_side_are_left_out_and_nothing_to_compare_says_so():
    verdict = curve_verdict("kl", [[None, 0.1, 0.2], [None, 0.1, 0.2]], [0.5, 0.1, 0.2, 9.0], "lower")
    assert verdict.verdict == SAME and verdict.reason == "over 2 step(s)"
    assert curve_verdict("kl", [[None], [None]], [0.1], "lower").verdict == NOT_COMPARED
    assert curve_verdict("kl", [], [0.1], "lower").verdict == NOT_COMPARED


def test_scalars():
    assert scalar_verdict("s_per_step", [1.0, 1.2], 1.15, "lower").verdict == SAME
    assert scalar_verdict("s_per_step", [1.0, 1.2], 0.5, "lower").verdict == BETTER
    assert scalar_verdict("samples_per_s", [10.0, 10.0], 8.0, "higher").verdict == WORSE  # 10% floor: 1.0
    assert scalar_verdict("samples_per_s", [10.0, 10.0], 10.9, "higher").verdict == SAME
    assert scalar_verdict("push_s", [None, None], 0.1, "lower").verdict == NOT_COMPARED
    assert scalar_verdict("push_s", [0.1], None, "lower").verdict == NOT_COMPARED


def test_decide_and_slope():
    assert decide(0.0, 0.0, "higher") == SAME
    with pytest.raises(ValueError, match="'higher' or 'lower'"):
        decide(1.0, 0.1, "up")
    assert least_squares_slope([1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert least_squares_slope([1.0]) is None
    assert trend_residual([0.0, 1.0, 2.0]) == pytest.approx(0.0)


def test_judge_covers_every_quantity():
    rows = [{"reward": 0.1 * t, "kl": 0.01, "actor_loss": 0.5, "critic_loss": 0.2} for t in range(4)]
    summary = {"final_reward": 0.3, "reward_slope": 0.1, "s_per_step": 1.0, "samples_per_s": 4.0,
               "whole_run_s": 60.0, "push_s": 0.1, "peak_memory": 2048.0}
    judged = judge([rows, rows], [summary, summary], rows, {**summary, "s_per_step": 2.0})
    by_name = {v.quantity: v.verdict for v in judged}
    assert by_name["reward"] == SAME and by_name["s_per_step"] == WORSE
    assert len(by_name) == 11 and all(math.isfinite(v.noise) for v in judged)
