"""The soak's arithmetic and bookkeeping (`benchmarks/memory_soak.py`), without a run: the slope over the last
80% of
the rounds, the role of each process title, and the sampler's window (first logged round until the last)."""
from __future__ import annotations

import os

import pytest
from memory_soak import TreeSampler, logged_rounds, role_of, slope_kib_per_round, summarize


def test_slope_is_the_least_squares_slope_after_the_warm_up():
    # 1 MiB of warm-up growth in the first 20% must not count; afterwards 3 KiB a round plus alternating noise
    points = [(r, 1000.0 + (1024.0 * r / 200 if r <= 200 else 1024.0 + 3.0 * (r - 200)) + (5 if r % 2 else -5))
              for r in range(1, 1001)]
    assert slope_kib_per_round(points) == pytest.approx(3.0, abs=0.01)
    flat = [(r, 500.0) for r in range(1, 101)]
    assert slope_kib_per_round(flat) == 0.0
    assert slope_kib_per_round(flat[:9]) is None, "fewer than 10 points after the warm-up"
    assert slope_kib_per_round([(5, 1.0)] * 20) is None, "a single round has no slope"
    summary = summarize({"driver": points, "consumer": []})
    assert set(summary) == {"driver"} and summary["driver"]["slope_kib_per_round"] == pytest.approx(3.0, abs=0.01)


def test_role_of_reads_the_process_title():
    assert role_of(["ray::ConsumerWorker.run"], 11, 10) == "consumer"
    assert role_of(["ray::RolloutQueueActor"], 11, 10) == "rollout_queue"
    assert role_of(["/venv/lib/ray/core/src/ray/gcs/gcs_server", "--log_dir=x"], 11, 10) == "gcs_server"
    assert role_of(["/venv/lib/ray/core/src/ray/raylet/raylet", "--x"], 11, 10) == "raylet"
    assert role_of(["ray::IDLE"], 11, 10) == "ray_other"
    assert role_of(["python", "benchmarks/memory_soak.py"], 10, 10) == "driver"


def test_sampler_samples_from_the_first_logged_round_until_the_last(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    sampler = TreeSampler(os.getpid(), metrics, last_round=3)
    assert sampler.sample_once() is None and logged_rounds(metrics) == 0, "nothing logged yet"
    metrics.write_text('{"step": 1}\n')
    first = sampler.sample_once()
    assert first is not None and first["driver"] > 0 and first["tree"] >= first["driver"]
    assert 0 <= first["driver:shmem"] <= first["driver"], "the shared part is part of the RSS"
    parts = first["driver:anon"] + first["driver:file"] + first["driver:shmem"]
    assert first["driver:anon"] > 0 and abs(parts - first["driver"]) < 0.05 * first["driver"], "the parts make the RSS"
    assert first["tree"] == sum(v for k, v in first.items() if not k.startswith("tree") and ":" not in k), "once"
    assert first["tree:anon"] == sum(v for k, v in first.items() if k.endswith(":anon") and k != "tree:anon")
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert sampler.sample_once() is None, "the last round is logged: the run tears down from here"
    assert [r for r, _ in sampler.samples["driver"]] == [1]


def test_trim_heap_returns_freed_memory_on_glibc():
    import platform

    from coati_relay.cluster.heap import trim_heap

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    assert trim_heap() is True
    assert trim_heap() is True, "the second call reuses the loaded C library"


@pytest.mark.parametrize("shape, rounds, words", [("weekly", 64, "shape must be one of"),
                                                  ("many_episodes", 60, "not a multiple of it")])
def test_a_soak_of_an_unknown_shape_or_a_partial_episode_is_refused(tmp_path, shape, rounds, words):
    from memory_soak import soak

    with pytest.raises(ValueError, match=words):
        soak("disaggregated", rounds, tmp_path, shape=shape)
    assert not (tmp_path / "child.log").exists(), "refused before any run starts"


def test_the_many_episode_shape_is_episodes_of_eight_rounds_with_a_checkpoint_each():
    from memory_soak import EPISODE_ROUNDS, soak_kwargs

    from coati_relay.checkpoint import save_due

    kw = soak_kwargs("model", "data.jsonl", "run", colocate=False, episodes=250)
    assert kw["num_episodes"] == 250 and EPISODE_ROUNDS == 8
    saves = [r for r in range(1, 2001) if save_due(r, EPISODE_ROUNDS, kw["save_interval"])]
    assert saves == list(range(8, 2001, 8)), "a checkpoint after each episode's last round only"
