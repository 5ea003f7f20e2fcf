"""One seed for every global random stream a run draws from: Python's ``random``, NumPy's and torch's."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seeds ``random``, ``numpy.random`` and torch (CPU and every CUDA device) with ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed_everything: seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)
