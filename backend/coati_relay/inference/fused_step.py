"""The decode loop's one-token step: the model's own forward (`ModelStep`), or the same arithmetic written out for the
Llama family (`FusedStep`: Llama, Qwen2, Mistral without a sliding window), which does per layer one matmul for the
query, key and value projections and one for the MLP's gate and up projections, and none of the forward's mask
building, module dispatch or output objects. On a 2-core CPU at batch 64 the decode loop over the fused step takes
0.80-0.82x (3.5M) and 0.86-0.88x (22M) of the time per token of the loop over the model's forward
(benchmarks/README.md, "Generation against its floor").

A step takes (feed [rows], mask [rows, K], positions [rows], cache, column) and returns float logits [rows, V]:
``cache`` is a transformers cache whose layers' ``update(keys, values)`` write the step's column and return the
cached columns ([rows, kv_heads, >= K, head_dim]), ``mask`` marks which of the first K to attend to (0 for left
padding and columns not written; the model's forward takes K = the cache's length or capacity, the fused step fewer),
``positions`` are the fed tokens' rotary positions, ``column`` (LongTensor [1], or None for the cache's length) the
column written, which a static cache's forward needs. Both steps read the model's parameters where they are: weight
loads and optimizer steps in place are seen by the next call. The fused step also keeps the concatenated projections
(`FusedStep.refresh`, once per generate call), a second copy of about three quarters of the decoder's weights, which
`FusedStep.release` frees. Its attention scores are float32 in every dtype, as SDPA keeps them.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

FUSED_MODEL_TYPES = ("llama", "qwen2", "mistral")


class ModelStep:
    """The model's own one-token forward (``logits_to_keep=1``)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def refresh(self) -> None:
        """Nothing to copy: the forward reads the parameters."""

    def release(self) -> None:
        """Nothing held."""

    def __call__(self, feed: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Cache,
                 column: Optional[torch.Tensor] = None) -> torch.Tensor:
        where = {} if column is None else {"cache_position": column}
        return self.model(input_ids=feed[:, None], attention_mask=mask, position_ids=positions[:, None],
                          past_key_values=cache, use_cache=True, logits_to_keep=1, **where).logits[:, -1].float()


def fused_step_refusal(model: torch.nn.Module) -> Optional[str]:
    """Why `FusedStep` cannot run ``model`` (None: it can)."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in FUSED_MODEL_TYPES:
        return f"model_type {kind!r} is not one of {list(FUSED_MODEL_TYPES)}"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return "the MLP is not a bias-free SiLU-gated one"
    if (getattr(config, "use_sliding_window", False) if kind == "qwen2"
            else getattr(config, "sliding_window", None) is not None):
        return "the attention has a sliding window"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "some layers do not attend to every position"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp is not 1"
    decoder = getattr(model, "model", None)
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "it is not laid out as transformers' own class of its model_type (model.model.layers, ...)"
    if getattr(decoder.rotary_emb, "rope_type", None) in (None, "dynamic", "longrope"):
        return "its rotary embedding depends on the sequence's length"
    for layer in decoder.layers:
        a, m = layer.self_attn, layer.mlp
        if any(type(p) is not torch.nn.Linear for p in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj,
                                                         m.up_proj, m.down_proj)):
            return "a projection is not a plain torch.nn.Linear (LoRA or quantized layers)"
    return None


class FusedStep:
    """The one-token forward of a Llama-family causal LM (`fused_step_refusal` says which), equal to its own to float
    rounding (about 1e-6 on float32 logits; in bfloat16 about as far from float32 as the model's own forward).

    Per step and layer: RMS norm, one ``[rows, H] x [H, (heads + 2 kv_heads) d]`` projection, rotary embedding from a
    table of every position, the cache update, attention over the cached columns (grouped queries without repeating
    keys), the output projection, RMS norm, one gate-and-up projection, SiLU-gated product, the down projection.
    """

    def __init__(self, model: torch.nn.Module):
        refusal = fused_step_refusal(model)
        if refusal is not None:
            raise ValueError(f"FusedStep: {refusal}; decode with the model's own forward (fused_decode=False)")
        config = model.config
        decoder = model.model
        self.model = model
        self.embed = decoder.embed_tokens
        self.layers = list(decoder.layers)
        self.norm = decoder.norm
        self.head = model.get_output_embeddings()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        positions = getattr(config, "max_position_embeddings", None) or 4096
        weight = self.embed.weight
        with torch.no_grad():  # [positions, head_dim] each, attention scaling included
            cos, sin = decoder.rotary_emb(weight[:1].float(), torch.arange(positions, device=weight.device)[None])
        self.cos, self.sin = _static(cos[0].to(weight.dtype)), _static(sin[0].to(weight.dtype))
        self._qkv: List[torch.Tensor] = []  # [(heads + 2 kv_heads) d, H] per layer
        self._qkv_bias: List[Optional[torch.Tensor]] = []
        self._gate_up: List[torch.Tensor] = []  # [2 I, H] per layer
        self.refresh()

    def refresh(self) -> None:
        """Copies the layers' current projection weights into the concatenated ones (once per generate call)."""
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                a, m = layer.self_attn, layer.mlp
                self._set(self._qkv, i, [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
                if all(b is not None for b in biases):
                    self._set(self._qkv_bias, i, biases)
                elif len(self._qkv_bias) <= i:
                    self._qkv_bias.append(None)
                self._set(self._gate_up, i, [m.gate_proj.weight, m.up_proj.weight])

    def release(self) -> None:
        """Frees the concatenated projections (while a colocated run trains); `refresh` makes them again."""
        self._qkv, self._qkv_bias, self._gate_up = [], [], []

    @staticmethod
    def _set(buffers: List[torch.Tensor], i: int, parts: List[torch.Tensor]) -> None:
        if len(buffers) <= i:
            buffers.append(_static(torch.cat([p.detach() for p in parts])))
        else:
            torch.cat([p.detach() for p in parts], out=buffers[i])

    def _rms(self, x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
        """The family's RMS norm: float32 statistics, the weight applied in the input's dtype."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * h.to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [rows, heads, d]; cos, sin: [rows, 1, d]."""
        half = x.size(-1) // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention of one token. q: [rows, kv_heads, group, d]; keys, values: [rows, kv_heads, K, d];
        bias: float32 [rows, 1, 1, K] (0 or -inf). The scores [rows, kv_heads, group, K] are float32 whatever the
        model's dtype, as SDPA keeps them (bfloat16 scores would round a sharp attention's logits by up to 1/256 of
        their size). Returns [rows, kv_heads, group, d] in q's dtype."""
        scores = torch.matmul(q.float(), keys.transpose(-1, -2).float()) * self.scale + bias
        return torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), values)

    def __call__(self, feed: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Cache,
                 column: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows, d, kv, group = feed.size(0), self.head_dim, self.kv_heads, self.heads // self.kv_heads
        q_width, kv_width = self.heads * d, kv * d
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        bias = torch.zeros(mask.shape, device=mask.device).masked_fill_(mask == 0, float("-inf"))
        bias = bias[:, None, None]  # [rows, 1, 1, K], float32
        x = self.embed(feed)  # [rows, H]
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            y = F.linear(self._rms(x, layer.input_layernorm), self._qkv[i], self._qkv_bias[i])
            q = self._rotate(y[:, :q_width].view(rows, self.heads, d), cos, sin)
            k = self._rotate(y[:, q_width:q_width + kv_width].view(rows, kv, d), cos, sin)
            keys, values = cache.layers[i].update(k[:, :, None], y[:, q_width + kv_width:].view(rows, kv, 1, d))
            keys, values = keys[:, :, :mask.size(1)], values[:, :, :mask.size(1)]  # a static cache's first K
            attended = self.attend(q.view(rows, kv, group, d), keys, values, bias)
            x = x + a.o_proj(attended.reshape(rows, q_width))
            gate, up = F.linear(self._rms(x, layer.post_attention_layernorm), self._gate_up[i]).chunk(2, dim=-1)
            x = x + layer.mlp.down_proj(F.silu(gate) * up)
        return self.head(self._rms(x, self.norm)).float()


def _static(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, marked as kept at its address: a CUDA graph of the compiled step reads it in place (unmarked, every
    replay would copy it in)."""
    torch._dynamo.mark_static_address(tensor)
    return tensor


def decode_step(model: torch.nn.Module, fused: bool):
    """`FusedStep` where ``fused`` and the model is of the family, else `ModelStep`."""
    if fused and fused_step_refusal(model) is None:
        return FusedStep(model)
    return ModelStep(model)
