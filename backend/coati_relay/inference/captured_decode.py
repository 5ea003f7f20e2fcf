"""The transformers backend's captured decode path (``compiled_decode``): one compiled one-token step replayed over a
static key/value cache, sampling inside the step, finished rows masked instead of dropped.

A `CapturedDecoder` belongs to one backend and keeps at most `MAX_BUCKETS` shape buckets (batch rows, cache capacity
rounded up to `CAPACITY_STEP`; the least recently used one is freed, all of them at `CapturedDecoder.release`), each a
transformers ``StaticCache`` and the step's buffers. The step is one ``torch.compile`` of `CapturedDecoder._step`
around the backend's one-token forward (`coati_relay.inference.fused_step`; inductor on the CPU, CUDA graphs through
``mode="reduce-overhead"`` on CUDA), with its own count of compiled entries (``isolate_recompiles``): one per bucket
shape and sampling setting, up to `RECOMPILE_LIMIT`, past which a call decodes uncompiled and says so. The width the
fused step attends to is a symbolic size, so it compiles once for every width; on CUDA it is rounded up to at most
`MAX_WIDTHS` sizes a bucket, each one CUDA graph recorded at its first use. Weight loads copy into the parameters in
place (`TransformersBackend.load_weights`) and the fused step's concatenated projections are refreshed in place, so
neither recompiles.

Draws are those of `coati_relay.inference.decode_loop.TokenSampler`: the exponential noise [rows, V] is drawn
eagerly (the same random stream as the loop) and the rest (temperature, top-k, top-p, the draw, the log-prob) runs
in the compiled step. Every row is sampled to the end of the batch, so tokens and log-probs equal the loop's while
the loop keeps every row (no stops, or fewer than an eighth of the rows stopped); afterwards the loop compacts its
batch and the two random streams part.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
from transformers.cache_utils import Cache

from coati_relay.config.schema import SamplingConfig
from coati_relay.inference.decode_loop import Decoded, StopStrings
from coati_relay.inference.fused_step import FusedStep, ModelStep

log = logging.getLogger(__name__)

CAPACITY_STEP = 64  # cache capacities are rounded up to a multiple of this, so prompt widths share a bucket
MAX_BUCKETS = 2  # buckets kept: a run's training and evaluation batches
MAX_WIDTHS = 8  # attended widths a bucket on CUDA, each a CUDA graph
# Compiled entries of one decoder (bucket shapes x sampling settings) before it decodes uncompiled; dynamo's own limit
# for it is twice this, as a width of 1 is a second entry of its bucket.
RECOMPILE_LIMIT = 32
# The phases of a compilation, each as the torch.compile timer that measures it (torch._dynamo.utils.compile_times):
# tracing the step's bytecode into a graph, lowering the graph to inductor's IR, generating the kernels' code,
# building and loading it (the C++ compiler on the CPU), and the guards that choose the compiled code at each call.
COMPILE_PHASES = {"trace": "bytecode_tracing", "lowering": "GraphLowering.run", "codegen": "GraphLowering.codegen",
                  "build": "PyCodeCache.load_by_key_path", "guards": "build_guards"}


def compile_totals() -> Dict[str, float]:
    """Seconds this process has spent in each of `COMPILE_PHASES` so far (0 for a timer torch did not record)."""
    names, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    totals = dict(zip(names, (float(v) for v in values)))
    return {phase: totals.get(timer, 0.0) for phase, timer in COMPILE_PHASES.items()}


class _Bucket:
    """One shape bucket's static cache [rows, heads, capacity, head_dim] per layer, attention mask [rows, capacity]
    and noise buffer [rows, V]."""

    def __init__(self, model: torch.nn.Module, rows: int, capacity: int, device: torch.device):
        from transformers import StaticCache

        config = model.config.get_text_config()
        self.cache = StaticCache(config=config, max_cache_len=capacity)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        empty = torch.zeros(rows, heads, 0, head_dim, dtype=model.dtype, device=device)
        for layer in self.cache.layers:
            layer.lazy_initialization(empty, empty)
        self.capacity = capacity
        self.mask = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self.noise = torch.empty(rows, model.get_input_embeddings().num_embeddings, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # the cache column a step writes
        for buffer in (self.mask, self.noise, self.column):  # fixed addresses: CUDA graphs read them without a copy
            torch._dynamo.mark_static_address(buffer)

    def nbytes(self) -> int:
        """Bytes of the cache and buffers."""
        layers = [t for layer in self.cache.layers for t in (layer.keys, layer.values)]
        return sum(t.numel() * t.element_size() for t in layers + [self.mask, self.noise, self.column])

    def start(self, prefilled: Optional[Cache], prompt_mask: torch.Tensor) -> None:
        """Writes the prompt's cached columns (``prefilled``: [rows, P - 1] per layer, or None when P = 1) and mask."""
        width = prompt_mask.size(1)
        for i, layer in enumerate(self.cache.layers):
            layer.cumulative_length.zero_()
            if prefilled is not None:
                layer.update(prefilled.layers[i].keys, prefilled.layers[i].values)
        self.mask.zero_()  # a column is attended to from the step that writes it on (`CapturedDecoder.decode`)
        self.mask[:, :width] = prompt_mask
        self.column.fill_(width - 1)


class CapturedDecoder:
    """Decodes through ``step`` (its model's one-token forward) compiled once per shape bucket. backend:
    ``torch.compile``'s (None: inductor, with ``mode="reduce-overhead"`` on CUDA); ``"eager"`` runs the same step
    uncompiled."""

    def __init__(self, step: Union[ModelStep, FusedStep], backend: Optional[str] = None):
        self.step = step
        self.model = model = step.model
        device = next(model.parameters()).device
        # The fused step attends to the columns its mask spans, a symbolic width: on CUDA the written ones rounded up
        # to one of at most MAX_WIDTHS sizes a bucket (a CUDA graph each), elsewhere exactly the written ones. The
        # model's forward attends to the bucket's whole capacity.
        self._windowed = isinstance(step, FusedStep)
        self._exact_window = device.type != "cuda"
        options = {"mode": "reduce-overhead"} if device.type == "cuda" and backend is None else {}
        self._step_fn: Callable = torch.compile(self._step, backend=backend or "inductor", dynamic=False,
                                                fullgraph=False, recompile_limit=2 * RECOMPILE_LIMIT,
                                                isolate_recompiles=True, **options)
        self._buckets: "OrderedDict[Tuple[int, int], _Bucket]" = OrderedDict()  # least recently used first
        self._compiled: set = set()  # (rows, capacity, sampling) entries compiled
        self.compile_s: Dict[Tuple[int, int], float] = {}  # per (rows, capacity): the first step's seconds
        self.compile_phases: Dict[Tuple[int, int], Dict[str, float]] = {}  # per bucket: `COMPILE_PHASES`' seconds

    def held_bytes(self) -> int:
        """Bytes the kept buckets hold (at most `MAX_BUCKETS` of them)."""
        return sum(bucket.nbytes() for bucket in self._buckets.values())

    def release(self) -> None:
        """Frees every bucket (a colocated run's training takes the memory); the next call allocates its bucket
        again, and its compiled step is kept."""
        self._buckets.clear()

    def _bucket(self, rows: int, needed: int, device: torch.device) -> _Bucket:
        """The smallest kept bucket of ``rows`` rows holding ``needed`` positions, else a new one (capacity rounded
        up to `CAPACITY_STEP`), the least recently used bucket freed past `MAX_BUCKETS`."""
        fitting = [key for key in self._buckets if key[0] == rows and key[1] >= needed]
        if fitting:
            key = min(fitting, key=lambda k: k[1])
            self._buckets.move_to_end(key)
            return self._buckets[key]
        capacity = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
        while len(self._buckets) >= MAX_BUCKETS:
            self._buckets.popitem(last=False)
        bucket = self._buckets[(rows, capacity)] = _Bucket(self.model, rows, capacity, device)
        return bucket

    def _step(self, bucket: _Bucket, mask: torch.Tensor, feed: torch.Tensor, positions: torch.Tensor,
              column: torch.Tensor, sampling: Tuple[bool, float, int, float]) -> Tuple[torch.Tensor, torch.Tensor]:
        """mask: [rows, K], the bucket's mask over the columns attended to; feed, positions: LongTensor [rows];
        column: LongTensor [1], the cache column written. Returns (tokens LongTensor [rows], log-probs FloatTensor
        [rows])."""
        greedy, temperature, top_k, top_p = sampling
        logits = self.step(feed, mask, positions, bucket.cache, column)
        scores = logits if greedy or temperature == 1.0 else logits / temperature
        if greedy:
            tokens = scores.argmax(dim=-1, keepdim=True)
        else:
            if top_k:
                kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if top_p < 1.0:
                ascending, order = torch.sort(scores, dim=-1)
                drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
                drop[:, -1] = False
                scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
            tokens = (torch.softmax(scores, dim=-1) / bucket.noise).argmax(dim=-1, keepdim=True)
        logprobs = scores.gather(1, tokens) - torch.logsumexp(scores, dim=-1, keepdim=True)
        return tokens[:, 0], logprobs[:, 0]

    def decode(self, prefilled: Optional[Cache], last_prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               sampling: SamplingConfig, stop_ids: List[int], pad_token_id: int,
               stop_strings: Optional[StopStrings] = None) -> Decoded:
        """`coati_relay.inference.decode_loop.decode`'s contract, with ``prefilled`` the model's cache of every prompt
        column but the last ([N rows, P - 1 positions]; None when P = 1)."""
        rows, width = prompt_mask.shape
        steps, device = sampling.max_new_tokens, prompt_mask.device
        bucket = self._bucket(rows, width + steps, device)
        key, capacity = (rows, bucket.capacity), bucket.capacity
        bucket.start(prefilled, prompt_mask)
        vocab = bucket.noise.size(1)
        greedy = sampling.temperature == 0 or not sampling.do_sample
        static = (greedy, float(sampling.temperature), min(sampling.top_k, vocab) if sampling.top_k > 0 else 0,
                  float(sampling.top_p))
        step_fn = self._entry(key + (static,))
        positions = prompt_mask.long().sum(dim=1) - 1
        stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
        tokens = torch.full((rows, steps), pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros(rows, steps, device=device)
        lengths = torch.full((rows,), steps, dtype=torch.long, device=device)
        alive = torch.ones(rows, dtype=torch.bool, device=device)
        feed = last_prompt_ids
        taken = 0
        for t in range(steps):
            if not greedy:
                bucket.noise.exponential_()
            bucket.mask[:, width - 1 + t] = 1
            first = key not in self.compile_s and step_fn is self._step_fn
            before = compile_totals() if first else None
            started = time.perf_counter()
            # the fused step writes at its cache's own length; the model's forward reads the column
            feed, drawn = step_fn(bucket, self._attended(bucket, width + t, capacity), feed.clone(),
                                  positions.clone(), None if self._windowed else bucket.column, static)
            if first:
                self.compile_s[key] = time.perf_counter() - started
                after = compile_totals()
                self.compile_phases[key] = {phase: after[phase] - before[phase] for phase in COMPILE_PHASES}
            tokens[:, t] = feed
            logprobs[:, t] = drawn
            taken = t + 1
            positions += 1
            bucket.column += 1
            if not stop_ids and stop_strings is None:
                continue
            stopped = alive & torch.isin(feed, stops)
            if stop_strings is not None:
                stopped |= alive & stop_strings(tokens[:, :t + 1], t + 1)
            lengths[stopped] = t + 1
            alive &= ~stopped
            if not bool(alive.any()):
                break
        lengths.clamp_(max=taken)
        return Decoded(tokens[:, :taken], logprobs[:, :taken], lengths)

    def _entry(self, entry: Tuple) -> Callable:
        """The compiled step for ``entry`` (rows, capacity, sampling), or the step uncompiled once this decoder holds
        `RECOMPILE_LIMIT` compiled entries (dynamo's own limit, past which it would run it uncompiled unannounced)."""
        if entry in self._compiled:
            return self._step_fn
        if len(self._compiled) >= RECOMPILE_LIMIT:
            log.warning("captured decode: %d shape buckets and sampling settings compiled already; %s decodes "
                        "uncompiled (fewer distinct batch sizes, prompt widths or sampling settings keep it compiled)",
                        RECOMPILE_LIMIT, entry)
            return self._step
        self._compiled.add(entry)
        return self._step_fn

    def _attended(self, bucket: _Bucket, written: int, capacity: int) -> torch.Tensor:
        """The bucket's mask over the columns the step attends to, ``written`` of them holding keys: exactly those,
        or on CUDA (not ``_exact_window``) those rounded up to a multiple of ``capacity / MAX_WIDTHS`` (itself a
        multiple of `CAPACITY_STEP`), short of the capacity. The width is marked symbolic: one compilation serves every
        width."""
        if not self._windowed:
            return bucket.mask
        if self._exact_window:
            width = written
        else:
            step = -(-capacity // (MAX_WIDTHS * CAPACITY_STEP)) * CAPACITY_STEP
            width = min(capacity - 1, -(-written // step) * step)  # the whole capacity would specialize the width
        mask = bucket.mask[:, :width]
        torch._dynamo.maybe_mark_dynamic(mask, 1)  # a width of 1 specializes: one more entry
        return mask
