"""Table-driven: every legacy name of coati_compat.imports.deprecations.DEPRECATIONS resolves at its legacy path and
warns FutureWarning with its replacement and guide anchor, at the caller's file and line, once per call site."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import warnings

import pytest

from coati_compat.imports import finder
from coati_compat.imports.deprecations import DEPRECATIONS, deprecated_api, message, warn_deprecated

finder.install()

MODULES = sorted(k for k, e in DEPRECATIONS.items() if e.is_module)
NAMES = sorted(k for k, e in DEPRECATIONS.items() if not e.is_module)


def _tiny_configs():
    from transformers import BloomConfig, GPT2Config, LlamaConfig, OPTConfig

    return {
        "GPT": GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32),
        "BLOOM": BloomConfig(n_layer=1, hidden_size=16, n_head=2, vocab_size=32),
        "OPT": OPTConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, ffn_dim=32, vocab_size=32,
                         max_position_embeddings=32, word_embed_proj_dim=16),
        "Llama": LlamaConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=32, vocab_size=32),
    }


def _probe_kwargs(name: str) -> dict:
    """Arguments that make the call fail fast right after the warning (model classes: a tiny config)."""
    short = name.rsplit(".", 1)[1]
    for family, config in _tiny_configs().items():
        if short in (f"{family}Actor", f"{family}Critic", f"{family}RM"):
            return {"config": config}
    return {"_coati_probe": True}


def _target(name: str):
    module, attr = DEPRECATIONS[name].target.split(":")
    return getattr(importlib.import_module(module), attr)


def _legacy(name: str):
    module, _, attr = name.rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return getattr(importlib.import_module(module), attr)


def _assert_one_warning_here(caught, name: str, lineno: int) -> None:
    ours = [w for w in caught if issubclass(w.category, FutureWarning) and name + " is deprecated" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    entry = DEPRECATIONS[name]
    text = str(ours[0].message)
    assert entry.replacement in text and entry.anchor in text and entry.anchor.startswith("migration_guide/")
    assert (ours[0].filename, ours[0].lineno) == (__file__, lineno)


def test_table_entries_are_well_formed():
    for name, entry in DEPRECATIONS.items():
        assert name.startswith("coati."), name
        assert entry.replacement and entry.removal and "#" in entry.anchor
        if not entry.is_module:
            module = name.rpartition(".")[0]
            assert module in DEPRECATIONS, f"{name}: its module {module} is not served"


def _resolve(dotted: str):
    """The object at ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


REPLACEMENT_NAMES = sorted({m.group(0) for e in DEPRECATIONS.values()
                            for m in re.finditer(r"\b(?:coati_relay|torch|transformers|peft)(?:\.[A-Za-z_]\w*)+",
                                                 e.replacement)})


@pytest.mark.parametrize("dotted", REPLACEMENT_NAMES)
def test_every_replacement_named_in_a_warning_exists(dotted):
    assert _resolve(dotted) is not None


@pytest.mark.parametrize("legacy", MODULES)
def test_module_resolves_and_warns_at_import_line(legacy):
    target = DEPRECATIONS[legacy].target
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        importlib.import_module(legacy)
    saved = sys.modules.pop(legacy)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = inspect.currentframe().f_lineno + 1
            module = importlib.import_module(legacy)
    finally:
        sys.modules[legacy] = saved
    assert module is importlib.import_module(target)
    _assert_one_warning_here(caught, legacy, line)


@pytest.mark.parametrize("name", NAMES)
def test_name_resolves_and_is_marked(name):
    obj = _target(name)
    assert _legacy(name) is obj
    assert obj.__deprecated__ == message(name)


@pytest.mark.parametrize("name", NAMES)
def test_name_warns_at_call_site(name):
    obj = _target(name)
    if hasattr(obj, "remote"):
        pytest.skip("Ray actor classes warn on .options()/.remote(); their own tests cover it")
    if inspect.isclass(obj) and inspect.isabstract(obj):
        pytest.skip("abstract: cannot be instantiated (subclassing is tested)")
    kwargs = _probe_kwargs(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 2
        try:
            obj(**kwargs)
        except Exception:  # the probe arguments are wrong on purpose; the warning comes first
            pass
    _assert_one_warning_here(caught, name, line)


CLASSES = [n for n in NAMES if n.rsplit(".", 1)[1][0].isupper()]


@pytest.mark.parametrize("name", [n for n in CLASSES if not n.startswith(("coati.ray.detached",
                                                                          "coati.ray.experience_maker_holder"))])
def test_user_subclass_warns_at_class_statement(name):
    obj = _target(name)
    assert inspect.isclass(obj)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        type("UserSubclass", (obj,), {"__module__": "user_script"})
    _assert_one_warning_here(caught, name, line)


def test_once_per_call_site_under_default_filter():
    from coati_compat.legacy.ray_utils import get_receivers_per_sender

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            get_receivers_per_sender(0, 2, 2, False)
        get_receivers_per_sender(1, 2, 2, False)
    assert [w.lineno for w in caught] == [caught[0].lineno, caught[0].lineno + 1]


def test_internal_calls_stay_silent():
    from transformers import GPT2Config

    from coati_compat.legacy.ray_utils import get_actor_from_args

    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_actor_from_args("gpt2", config=config, lora_rank=2)
    assert [str(w.message).split(" ")[0] for w in caught if w.category is FutureWarning] == [
        "coati.ray.utils.get_actor_from_args"]


def test_warn_deprecated_stacklevel_and_errors():
    def helper():
        warn_deprecated("coati.ray.utils.state_dict_to", stacklevel=2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        helper()
    _assert_one_warning_here(caught, "coati.ray.utils.state_dict_to", line)
    with pytest.raises(KeyError, match="not in the deprecation table"):
        warn_deprecated("coati.nope")
    with pytest.raises(ValueError, match="stacklevel"):
        warn_deprecated("coati.ray.utils.state_dict_to", stacklevel=0)
    with pytest.raises(TypeError, match="class or a function"):
        deprecated_api("coati.ray.utils.state_dict_to")(42)


def test_deprecated_class_without_init_keeps_cooperative_multiple_inheritance():
    import warnings

    from coati_compat.legacy.callbacks import MakerCallback

    class Recorder:
        def __init__(self, tag):
            self.tag = tag

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)

        class Both(MakerCallback, Recorder):
            pass

        assert Both("x").tag == "x"
