"""`callbacks`: checked in the driver before any actor starts; kept out of what the actors receive."""
from __future__ import annotations

import pickle
import threading

import pytest

from coati_relay import StopRun
from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.callbacks import Hooks
from coati_relay.config.callbacks import check_callbacks, may_stop
from coati_relay.observe.run_result import CallbackError
from tests.unit.small_run import small_run_kwargs


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()  # not picklable: callbacks never leave the driver

    def on_round_end(self, step, metrics):
        pass


class Misspelt:
    def on_round_ended(self, step, metrics):
        pass


class NoHook:
    def something(self):
        pass


def _errors(callbacks):
    errors = []
    check_callbacks(errors, callbacks)
    return errors


def test_a_misspelt_hook_names_the_closest_one():
    (msg,) = _errors([Misspelt()])
    assert "on_round_ended" in msg and "did you mean 'on_round_end'" in msg


def test_callbacks_must_be_a_list_of_objects_with_a_hook():
    assert "must be a list" in _errors(Recorder())[0]
    assert "none of the hook methods" in _errors([NoHook()])[0]
    assert "is a class" in _errors([Recorder])[0]
    assert _errors([Recorder()]) == [] and _errors(None) == []


def test_only_hooks_that_may_stop_make_the_consumers_wait():
    class End:
        def on_run_end(self, result):
            pass

    assert may_stop([Recorder()]) and not may_stop([End()])


def test_config_error_before_any_actor_and_actors_get_no_callbacks(tmp_path, tiny_model_path):
    with pytest.raises(ConfigError, match="did you mean 'on_round_end'"):
        build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, callbacks=[Misspelt()]))
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, callbacks=[Recorder()]))
    assert len(cfg.callbacks) == 1 and cfg.stop_gate
    with pytest.raises(TypeError):
        pickle.dumps(cfg)  # the lock: proves the test's callback cannot travel
    shipped = pickle.loads(pickle.dumps(cfg.for_actors()))
    assert shipped.callbacks == () and shipped.stop_gate


def test_hooks_run_in_order_and_stop_or_fail_by_name():
    calls = []

    class A:
        def on_round_end(self, step, metrics):
            calls.append(("A", step))
            if step == 2:
                raise StopRun

    class B:
        def on_round_end(self, step, metrics):
            calls.append(("B", step))

        def on_checkpoint(self, step, path):
            calls.append(("B.ckpt", step, path))

    hooks = Hooks([A(), B()])
    assert not hooks.round_end(1, {"step": 1}, "ckpt-1")
    assert hooks.round_end(2, {"step": 2})
    assert calls == [("A", 1), ("B", 1), ("B.ckpt", 1, "ckpt-1"), ("A", 2), ("B", 2)]
    assert hooks.stop_at == 2

    class Bad:
        def on_run_start(self, config):
            raise KeyError("boom")

    with pytest.raises(CallbackError, match=r"Bad\.on_run_start raised KeyError"):
        Hooks([Bad()]).run_start(None)
