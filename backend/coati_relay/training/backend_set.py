"""The training backends of one process, found by what a caller holds: the model or optimizer a `TrainingBackend`
gave back (or an optimizer inside that one's wrappers), as scripts that keep only those pass them back."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from .booster_backend import TrainingBackend, unwrap_boosted
from .checkpoint_files import PlainFiles
from .master_weights import optimizer_chain
from .state_dict_shards import sub_state_dict


class BackendSet(List["TrainingBackend"]):
    """`TrainingBackend`s in the order they were added."""

    def add(self, backend: "TrainingBackend") -> "TrainingBackend":
        self.append(backend)
        return backend

    def find(self, model: Optional[nn.Module] = None, optimizer: Any = None) -> Optional["TrainingBackend"]:
        """The backend holding ``optimizer`` (its own, or one inside its wrappers), else the one whose model is
        ``model``; None when none holds either."""
        if optimizer is not None:
            for backend in self:
                if any(o is optimizer for o in optimizer_chain(backend.optimizer)):
                    return backend
        return next((b for b in self if model is not None and b.model is model), None)

    def files(self, model: Optional[nn.Module] = None,
              optimizer: Any = None) -> Union["TrainingBackend", PlainFiles]:
        """What saves and loads ``model``'s or ``optimizer``'s checkpoints: the backend holding it, else plain torch
        files of it as it is (`PlainFiles`)."""
        backend = self.find(model, optimizer)
        return backend if backend is not None else PlainFiles(model, optimizer)

    def training(self, model: Optional[nn.Module], optimizer: Any, wrap_unknown: bool = False,
                 name: str = "model") -> "TrainingBackend":
        """The backend to train ``model`` with ``optimizer`` (`find`). ``wrap_unknown``: one it holds neither of is
        added around them as they are (no plugin, no master weights); else that is an error."""
        backend = self.find(model, optimizer)
        if backend is None and wrap_unknown and model is not None:
            backend = self.add(TrainingBackend.around(model, optimizer, master_weights=False, name=name))
        if backend is None:
            raise ValueError("this optimizer (and model) came from no TrainingBackend here; prepare (model, "
                             "optimizer) first and train what it gives back")
        return backend

    def unwrapped(self, model: nn.Module) -> nn.Module:
        """The module inside the wrappers of ``model``'s backend, or of ``model`` where no backend holds it."""
        backend = self.find(model)
        return backend.unwrapped() if backend is not None else unwrap_boosted(model)

    def module_state(self, model: nn.Module, submodule: Optional[str] = None,
                     requires_grad_only: bool = False) -> Dict[str, torch.Tensor]:
        """The complete state dict of `unwrapped` ``model`` (its backend gathers Gemini's chunks: every rank calls).
        submodule: only that child's entries, under its own names. requires_grad_only: only trainable parameters."""
        backend = self.find(model)
        inner = self.unwrapped(model)
        state = backend.full_state_dict() if backend is not None else inner.state_dict()
        if submodule is not None:
            state, inner = sub_state_dict(state, submodule), getattr(inner, submodule)
        if requires_grad_only:
            trainable = {n for n, p in inner.named_parameters() if p.requires_grad}
            state = {k: v for k, v in state.items() if k in trainable}
        return state
