"""The inference backends by name: each registers one `BackendSpec`, and the config checks, the producer and the
colocated run look it up by ``inference_backend`` (`backend_spec`) instead of comparing names.

The built-in ones register in `coati_relay.inference.vllm_spec` and `coati_relay.inference.transformers_spec`, which
import their backend only when it is built. Adding one is a spec like theirs passed to `register_backend`.

A registration holds in the process that makes it: the driver's checks and a colocated run (in the driver's
process) see it, but a disaggregated run's Ray actors import only the built-in ones (`coati_relay.inference`
imports them), so a new backend reaches them only from a module they import too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from coati_relay.config.checks import Check


@dataclass(frozen=True)
class BackendSpec:
    """What the engine knows about one inference backend.

    name: the ``inference_backend`` value.
    build: ``build(model_path, sampling, **kwargs)`` -> an `InferenceBackend` holding its own copy of the checkpoint;
      ``kwargs``: ``tokenizer``, ``seed``, what ``run_sizing`` returns and the checked engine keywords.
    build_on_module: ``build_on_module(model, model_path, sampling, weights, **kwargs)`` -> a backend generating from
      ``model``, a causal LM held in this process: the module itself where ``generates_in_place``, else an engine
      started from ``weights`` (HF name -> tensor; None: the module's own). ``model_path``: its checkpoint, or None
      with ``eos_token_ids`` and ``pad_token_id`` in ``kwargs``.
    engine_keys: the ``inference_model_config`` keys it takes besides ``path``, each with its check.
    refused_keys: keys refused for it only, with what to do instead.
    generate_key: ``generate_key(key)`` -> how it takes a ``generate_config`` key
      (`coati_relay.inference.generate_keys.classify`).
    stop_key: its ``generate_config`` key for stop strings.
    engine_dtype: a dtype name (``"bfloat16"``, ...) as its ``dtype`` keyword takes it (its precision rule; the
      consumers' compute dtype is given to it unless the user set one).
    adapt_keys: ``adapt_keys(errors, imc, differences, cuda)`` rewrites ColossalChat's keys of ``imc`` (a dict) into
      its own, in place; None: it takes them as given.
    tensor_parallel: it shards one engine over ``num_proc_per_producer`` GPUs.
    generates_in_place: in a colocated run it generates with the training module itself (no copy, no weight loads,
      the trainer's device and dtype), so ``inference_model_config`` may hold only ``in_place_keys`` there.
    in_place_keys: the engine keys a backend around the training module takes.
    run_sizing: ``run_sizing(rows, prompt_tokens)`` -> keywords sizing its engine to the run (the rows of one
      generate call, the prompts' width); None: it needs none. An engine sized so takes no longer prompts or
      responses than the training ones.
    fit_beside_trainer: ``fit_beside_trainer(kwargs, reserve_bytes)`` -> its engine keywords on the device where a
      colocated trainer and the producer's reward model loaded first, ``reserve_bytes`` kept for the trainer's first
      step (``kwargs`` as they are where it needs no fitting, e.g. off CUDA); None: it needs none.
    """

    name: str
    build: Callable[..., Any]
    build_on_module: Callable[..., Any]
    engine_keys: Mapping[str, Check]
    generate_key: Callable[[str], Tuple[str, Optional[str]]]
    stop_key: str
    engine_dtype: Callable[[str], Any]
    refused_keys: Mapping[str, str] = field(default_factory=dict)
    adapt_keys: Optional[Callable[[List[str], Dict[str, Any], Optional[List[str]], bool], None]] = None
    tensor_parallel: bool = False
    generates_in_place: bool = False
    in_place_keys: Tuple[str, ...] = ()
    run_sizing: Optional[Callable[[int, int], Dict[str, int]]] = None
    fit_beside_trainer: Optional[Callable[[Dict[str, Any], int], Dict[str, Any]]] = None


_BACKENDS: Dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec) -> BackendSpec:
    """Makes ``spec`` the backend named ``spec.name``; a taken name raises."""
    if spec.name in _BACKENDS:
        raise ValueError(f"inference backend {spec.name!r} is registered already")
    _BACKENDS[spec.name] = spec
    return spec


def backend_names() -> Tuple[str, ...]:
    """The registered names, in the order they were registered."""
    return tuple(_BACKENDS)


def find_backend(name: Any) -> Optional[BackendSpec]:
    """The spec registered as ``name``, or None."""
    return _BACKENDS.get(name) if isinstance(name, str) else None


def backend_spec(name: str) -> BackendSpec:
    """The spec registered as ``name``; an unknown name raises a ValueError naming the registered ones."""
    spec = find_backend(name)
    if spec is None:
        raise ValueError(f"unknown inference backend {name!r}; choose one of {list(_BACKENDS)}")
    return spec
