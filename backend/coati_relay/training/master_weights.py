"""fp32 master weights for fp16/bf16 models, under the plugins that keep none of their own (``ddp``, no plugin).

A model built with ``.half()`` whose optimizer steps the fp16 weights themselves breaks at once: Adam's
``eps=1e-8`` is 0 in fp16, so each element with a zero gradient becomes 0/0 = NaN after one step. LowLevelZero and
Gemini keep fp32 masters and a dynamic loss scale; `TrainingBackend` gives every other plugin the same through
`MasterWeightOptimizer`, which wraps the given optimizer: its parameter groups hold fp32 copies of the
low-precision parameters, ``step()`` unscales the model's gradients into them, steps, and copies the result back
into the model's weights. fp16 adds a dynamic loss scale (``scale_loss`` before backward); an overflow skips the
step and lowers the scale, as the ColossalAI mixed-precision optimizers do. fp32 parameters are stepped as they
are, so an fp32 model's numbers do not change.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

logger = logging.getLogger(__name__)

LOW_PRECISION = (torch.float16, torch.bfloat16)


class DynamicLossScale:
    """The fp16 loss scale: times ``backoff_factor`` after ``hysteresis`` overflowing steps, times
    ``growth_factor`` after ``growth_interval`` clean steps, kept in [min_scale, max_scale]."""

    def __init__(self, initial_scale: float = 2 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 1000, hysteresis: int = 2, min_scale: float = 1.0,
                 max_scale: float = 2 ** 32) -> None:
        if not min_scale <= initial_scale <= max_scale:
            raise ValueError(f"initial_scale {initial_scale} must lie in [min_scale {min_scale}, "
                             f"max_scale {max_scale}]")
        if growth_factor < 1 or not 0 < backoff_factor < 1 or growth_interval < 1 or hysteresis < 1:
            raise ValueError("need growth_factor >= 1, 0 < backoff_factor < 1, growth_interval >= 1, hysteresis >= 1; "
                             f"got {growth_factor}, {backoff_factor}, {growth_interval}, {hysteresis}")
        self.scale = float(initial_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.hysteresis = int(growth_interval), int(hysteresis)
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self._clean_steps = 0
        self._overflows_left = self.hysteresis

    def update(self, overflow: bool) -> None:
        if overflow:
            self._clean_steps = 0
            self._overflows_left -= 1
            if self._overflows_left <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
                self._overflows_left = self.hysteresis
            return
        self._clean_steps += 1
        if self._clean_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self._clean_steps = 0
            self._overflows_left = self.hysteresis

    def state_dict(self) -> Dict[str, float]:
        return {"scale": self.scale, "clean_steps": self._clean_steps, "overflows_left": self._overflows_left}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.scale = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])
        self._overflows_left = int(state["overflows_left"])


class MasterWeightOptimizer:
    """An optimizer over fp32 master copies of a model's fp16/bf16 parameters.

    optimizer: the optimizer over the model's parameters, before its first step; its parameter groups are rewired to
    the masters, so its hyper-parameters and class stay the caller's.
    loss_scale: keyword options of `DynamicLossScale`, used when any parameter is fp16.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, **loss_scale: Any) -> None:
        if optimizer.state:
            raise ValueError("fp32 master weights must be set up before the optimizer's first step "
                             "(wrap a fresh optimizer)")
        self.optim = optimizer
        self._pairs: List[Tuple[nn.Parameter, nn.Parameter]] = []  # (model weight, fp32 master)
        has_fp16 = False
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                if param.dtype in LOW_PRECISION:
                    has_fp16 |= param.dtype == torch.float16
                    master = nn.Parameter(param.detach().float().clone(), requires_grad=param.requires_grad)
                    self._pairs.append((param, master))
                    param = master
                params.append(param)
            group["params"] = params
        self.loss_scale: Optional[DynamicLossScale] = DynamicLossScale(**loss_scale) if has_fp16 else None
        self._pending_scale = 1.0
        self._unscaled: Optional[bool] = None
        self.skipped_steps = 0

    # -- the optimizer protocol ---------------------------------------------------------------------------------
    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optim.param_groups

    @property
    def state(self) -> Dict[Any, Any]:
        return self.optim.state

    @property
    def defaults(self) -> Dict[str, Any]:
        return self.optim.defaults

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward`` on: times the current fp16 loss scale (unchanged for bf16)."""
        self._pending_scale = self.loss_scale.scale if self.loss_scale is not None else 1.0
        return loss * self._pending_scale

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.scale_loss(loss).backward(*args, **kwargs)

    @torch.no_grad()
    def unscale_grads(self) -> bool:
        """Writes the model's gradients, unscaled, into the masters' ``.grad`` (once per step); True when all are
        finite. The gradients of fp32 parameters are unscaled in place."""
        if self._unscaled is not None:
            return self._unscaled
        inv_scale, self._pending_scale = 1.0 / self._pending_scale, 1.0
        grads = []
        for param, master in self._pairs:
            master.grad = None if param.grad is None else param.grad.float().mul_(inv_scale)
            if master.grad is not None:
                grads.append(master.grad)
        if inv_scale != 1.0:
            grads += [p.grad.mul_(inv_scale) for p in self._own_params() if p.grad is not None]
        self._unscaled = all_finite(grads)
        return self._unscaled

    @torch.no_grad()
    def step(self, closure: Any = None) -> Optional[torch.Tensor]:
        """Unscales the model's gradients into the masters, steps them and writes them back into the model.

        The model's low-precision gradients are consumed (set to None). With fp16, a non-finite gradient (overflow
        at the current loss scale) skips the step and lowers the scale.
        """
        if closure is not None:
            raise ValueError("MasterWeightOptimizer.step does not take a closure")
        finite = self.unscale_grads()
        self._unscaled = None
        for param, _ in self._pairs:  # consumed: a zero_grad of the wrapped optimizer clears only the masters
            param.grad = None
        if self.loss_scale is not None:
            self.loss_scale.update(overflow=not finite)
            if not finite:
                self.skipped_steps += 1
                logger.warning("fp16 gradient overflow: step skipped, loss scale now %g", self.loss_scale.scale)
                return None
        result = self.optim.step()
        for param, master in self._pairs:
            param.copy_(master)
        return result

    def _own_params(self) -> List[torch.Tensor]:
        """The fp32 parameters the optimizer steps as they are (no master copy)."""
        masters = {id(m) for _, m in self._pairs}
        return [p for group in self.optim.param_groups for p in group["params"] if id(p) not in masters]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)
        for param, _ in self._pairs:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()

    def state_dict(self) -> Dict[str, Any]:
        return {"optimizer": self.optim.state_dict(), "masters": [m.detach().clone() for _, m in self._pairs],
                "loss_scale": self.loss_scale.state_dict() if self.loss_scale is not None else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        masters = state["masters"]
        if len(masters) != len(self._pairs):
            raise ValueError(f"the saved state has {len(masters)} master weights, this optimizer {len(self._pairs)}")
        self.optim.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for (param, master), saved in zip(self._pairs, masters):
                master.copy_(saved)
                param.copy_(saved)
        if self.loss_scale is not None and state.get("loss_scale") is not None:
            self.loss_scale.load_state_dict(state["loss_scale"])

    def __getattr__(self, name: str) -> Any:  # everything else of the user's optimizer (e.g. hooks, custom attrs)
        if name == "optim":
            raise AttributeError(name)
        return getattr(self.optim, name)

    def __repr__(self) -> str:
        return f"MasterWeightOptimizer({self.optim!r}, fp32 masters of {len(self._pairs)} tensors)"


def all_finite(tensors: List[torch.Tensor]) -> bool:
    """True when no element of ``tensors`` is inf or NaN.

    The fast path sums each tensor (low precision in fp32) and syncs once per device: a sum is finite only where no
    element is inf or NaN, and it allocates nothing of the tensor's size. A sum that overflows on finite elements
    falls back to an element-wise check."""
    sums: Dict[torch.device, List[torch.Tensor]] = {}
    for t in tensors:
        total = t.sum(dtype=torch.float32) if t.dtype in LOW_PRECISION else t.sum()
        sums.setdefault(t.device, []).append(total.float())
    if all(bool(torch.isfinite(torch.stack(group)).all()) for group in sums.values()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def low_precision_params(params: Iterable[torch.Tensor]) -> bool:
    """True when any of ``params`` is fp16 or bf16."""
    return any(p.dtype in LOW_PRECISION for p in params)


def with_master_weights(optimizer: Any, **loss_scale: Any) -> Any:
    """``optimizer`` wrapped in `MasterWeightOptimizer` when it steps fp16/bf16 parameters; else unchanged."""
    if optimizer is None or isinstance(optimizer, MasterWeightOptimizer):
        return optimizer
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not low_precision_params(params):
        return optimizer
    logger.info("fp32 master weights for %d fp16/bf16 tensors of %s", sum(p.dtype in LOW_PRECISION for p in params),
                type(optimizer).__name__)
    return MasterWeightOptimizer(optimizer, **loss_scale)


def optimizer_chain(optimizer: Any) -> List[Any]:
    """``optimizer`` and the optimizers it wraps, outermost first (a plugin's ``OptimizerWrapper``, fp32 masters, the
    optimizer they step), following ``.optim`` at most four levels down."""
    chain: List[Any] = []
    while optimizer is not None and len(chain) < 4:
        chain.append(optimizer)
        optimizer = getattr(optimizer, "optim", None)
    return chain


def find_master_optimizer(optimizer: Any) -> Optional[MasterWeightOptimizer]:
    """The `MasterWeightOptimizer` inside ``optimizer`` (itself, or under ColossalAI's ``OptimizerWrapper.optim``)."""
    return next((o for o in optimizer_chain(optimizer) if isinstance(o, MasterWeightOptimizer)), None)
