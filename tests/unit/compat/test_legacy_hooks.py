"""`coati_compat.legacy_hooks.LegacyHook`: a legacy callback object driven by the engine's `Hooks` (the very
dispatcher a run uses), where its moment exists; the others warn and are never called."""
from __future__ import annotations

import warnings

import pytest

from coati_compat.legacy.callbacks import MakerCallback, TrainerCallback
from coati_compat.legacy_hooks import LegacyHook, legacy_hooks
from coati_relay.callbacks import Hooks

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # the legacy base classes are deprecated names

RECORD = {"step": 3, "time": 1.5, "loss": 0.25, "reward": 0.5}


class Recorder(TrainerCallback):
    def __init__(self):
        self.calls = []

    def on_fit_start(self):
        self.calls.append(("fit_start",))

    def on_batch_end(self, metrics, experience):
        self.calls.append(("batch_end", metrics, experience))

    def on_update_end(self):
        self.calls.append(("update_end",))

    def on_fit_end(self):
        self.calls.append(("fit_end",))


class MakerRecorder(MakerCallback):
    def __init__(self):
        self.calls = []

    def on_loop_start(self):
        self.calls.append("loop_start")

    def on_loop_end(self):
        self.calls.append("loop_end")


def run(hooks):
    """What a run does with its hooks: start, two rounds, end."""
    h = Hooks(hooks)
    h.run_start(object())
    for step in (1, 2):
        h.round_end(step, {**RECORD, "step": step})
    h.run_end(object())


def test_trainer_callback_methods_run_at_their_moments():
    cb = Recorder()
    run([LegacyHook(cb)])
    metrics = {"loss": 0.25, "reward": 0.5}
    assert cb.calls == [("fit_start",), ("batch_end", metrics, None), ("update_end",), ("batch_end", metrics, None),
                        ("update_end",), ("fit_end",)]


def test_metrics_are_renamed_to_the_legacy_names():
    cb = Recorder()
    run([LegacyHook(cb, metrics={"pg_loss": "loss"})])
    assert cb.calls[1] == ("batch_end", {"pg_loss": 0.25}, None)


def test_a_metric_the_record_lacks_fails_the_run_naming_it():
    from coati_relay.observe.run_result import CallbackError

    with pytest.raises(CallbackError, match=r"LegacyHook.on_round_end.*\['value_loss'\].*holds"):
        run([LegacyHook(Recorder(), metrics={"critic_loss": "value_loss"})])


def test_maker_callback_runs_at_run_start_and_end():
    cb = MakerRecorder()
    run(legacy_hooks([cb]))
    assert cb.calls == ["loop_start", "loop_end"]


def test_methods_without_a_moment_warn_once_and_are_never_called():
    class Episodes(TrainerCallback):
        def __init__(self):
            self.calls = 0

        def on_episode_end(self, episode):
            self.calls += 1

        def on_batch_start(self):
            self.calls += 1

    cb = Episodes()
    with pytest.warns(UserWarning, match="on_episode_end, on_batch_start.*closest hook is on_round_end"):
        hook = LegacyHook(cb)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run([hook])
    assert cb.calls == 0


def test_a_plain_object_with_legacy_method_names_is_wrapped_too():
    class Plain:
        def __init__(self):
            self.seen = []

        def on_batch_end(self, metrics, experience):
            self.seen.append(metrics["reward"])

    cb = Plain()
    run([LegacyHook(cb)])
    assert cb.seen == [0.5, 0.5]
