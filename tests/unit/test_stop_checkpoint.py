"""`StopRun` at a step that saves no checkpoint of its own: the colocated run saves one there, tells `on_checkpoint`,
and lists it last in `result.checkpoints` (the one an export takes), as the disaggregated run does."""
from __future__ import annotations

import pytest

from coati_relay import StopRun, launch_distributed
from tests.unit.small_run import small_run_kwargs


class _StopAt:
    def __init__(self, at: int):
        self.at, self.checkpoints = at, []

    def on_round_end(self, step, metrics):
        if step == self.at:
            raise StopRun

    def on_checkpoint(self, step, path):
        self.checkpoints.append((step, path))


@pytest.mark.slow
def test_a_colocated_stop_saves_and_lists_its_checkpoint(tmp_path, tiny_model_path):
    stop = _StopAt(1)
    kw = small_run_kwargs(tmp_path, tiny_model_path, num_episodes=2, colocate=True, save_interval=100,
                          progress=False, export_dir=False, inference_model_config=None)
    result = launch_distributed(**kw, callbacks=[stop])
    saved = str(tmp_path / "run" / "checkpoints" / "step-000001")
    assert result.stopped_at == 1 and [r["step"] for r in result.history] == [1]
    assert result.checkpoints == [saved] and stop.checkpoints == [(1, saved)]
