"""coati-relay's engine: vLLM producers, ColossalAI consumers, Ray in between.

Entry points: `launch_distributed(...)` with ColossalChat's keywords (plus ``core_algo="PPO"``; ``help(
launch_distributed)`` lists every keyword) and, as in ColossalChat, the zero-bubble variant in a module of its
own: ``from coati_relay.launch_zero_bubble import launch_distributed`` (the same keywords plus
``data_actor_buffer_size_limit``); both return a `RunResult`.
Extension points: `register_reward` (a reward function by name), `register_estimator` (an advantage estimator
by name) and `register_algorithm` (an advantage estimator, policy loss, value loss or KL estimator by name;
`coati_relay.algorithms.register`).
Hooks: ``callbacks=[...]`` (`coati_relay.callbacks`), `StopRun` to end a run early, `CallbackError` when a
hook fails. `build_tiny_model` writes a tiny local model for trying things out.

Names load on first use, so that `import coati_relay` stays cheap (torch, transformers and Ray are imported only
by what needs them). Importing it filters a few known third-party warnings (`coati_relay.observe.quiet_warnings`).
"""
from __future__ import annotations

__version__ = "0.1.0"

from coati_relay.observe import quiet_warnings  # noqa: E402  (known third-party noise)

quiet_warnings.install()

# public name -> (module, attribute)
_EXPORTS = {
    "launch_distributed": ("coati_relay.launch", "launch_distributed"),
    "RunResult": ("coati_relay.observe.run_result", "RunResult"),
    "RunFailed": ("coati_relay.observe.run_result", "RunFailed"),
    "CallbackError": ("coati_relay.observe.run_result", "CallbackError"),
    "StopRun": ("coati_relay.callbacks", "StopRun"),
    "ConfigError": ("coati_relay.assembly.build", "ConfigError"),
    "build_run_config": ("coati_relay.assembly.build", "build_run_config"),
    "register_reward": ("coati_relay.rewards", "register_reward"),
    "register_algorithm": ("coati_relay.algorithms", "register"),
    "register_estimator": ("coati_relay.algorithms", "register_estimator"),
    "build_tiny_model": ("coati_relay.toy", "build_tiny_model"),
    "write_toy_dataset": ("coati_relay.toy", "write_toy_dataset"),
}
__all__ = sorted(_EXPORTS)
# submodules that are public entries themselves: `coati_relay.launch_zero_bubble` is the module (as ColossalChat's
# ``coati.distributed.launch_zero_bubble``), whose `launch_distributed` is the zero-bubble entry
_ENTRY_MODULES = ("launch_zero_bubble",)


def __getattr__(name: str):
    import importlib

    if name in _ENTRY_MODULES:
        return importlib.import_module(f"coati_relay.{name}")  # the import binds it here
    if name not in _EXPORTS:
        raise AttributeError(f"module 'coati_relay' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted({*__all__, *_ENTRY_MODULES, "__version__", *(n for n in globals() if n.startswith("__"))})
