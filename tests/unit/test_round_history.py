"""`RoundHistory`: a run's round records kept by column give back the dicts that went in, and cost about 8 bytes a
number."""
from __future__ import annotations

import math
import pickle
import sys

import pytest

from coati_relay.observe.round_history import RoundHistory


def record(step: int, **extra):
    return {"step": step, "reward": step / 3, "loss": -0.0 if step == 2 else 1.5 * step, "samples": 32, **extra}


def test_rows_come_back_with_their_keys_order_and_types():
    rows = [record(1), record(2, checkpoint="ckpt/step-2"), {"note": "x", "step": 3, "flag": True},
            record(4, reward=math.inf, samples=2 ** 70), {**record(5, loss=7), "step": 5.5}, {}]
    history = RoundHistory(rows)
    assert len(history) == len(rows)
    for got, want in zip(history, rows):
        assert list(got) == list(want)
        assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
    assert history == rows and history[1]["checkpoint"] == "ckpt/step-2"
    assert math.copysign(1.0, history[1]["loss"]) == -1.0, "-0.0 keeps its sign"
    assert history[2]["flag"] is True and history[3]["samples"] == 2 ** 70
    assert history[-1] == {} and history[-6] == rows[0]
    assert history[1:3] == rows[1:3] and history[::-2] == rows[::-2]
    with pytest.raises(IndexError, match="out of range"):
        history[6]


def test_nan_stays_nan_and_equality_reads_values():
    history = RoundHistory([record(1, grad_norm=math.nan)])
    assert math.isnan(history[0]["grad_norm"])
    assert history != [record(2)] and history != [] and RoundHistory() == []
    assert history != "not a history"


def test_a_pickled_history_reads_the_same():
    rows = [record(i, checkpoint=f"c{i}") if i % 7 == 0 else record(i) for i in range(1, 30)]
    assert pickle.loads(pickle.dumps(RoundHistory(rows))) == rows


def test_a_round_costs_bytes_a_number_not_a_dict():
    rows = [{"step": i, **{f"metric_{k}": i * 0.1 + k for k in range(20)}} for i in range(1, 1001)]
    history = RoundHistory(rows)
    assert history.nbytes <= len(rows) * (21 * 8 + 8)
    as_dicts = sum(sys.getsizeof(r) + sum(sys.getsizeof(v) for v in r.values()) for r in rows)
    assert history.nbytes * 5 < as_dicts
