"""Reference legacy ``coati.ray.utils`` helpers with their legacy behaviour (legacy_spec §A.6)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List

import torch


def get_receivers_per_sender(sender_idx: int, num_senders: int, num_receivers: int,
                             allow_idle_sender: bool) -> List[int]:
    """Receivers of a sender: all ``i`` in [0, num_receivers) with ``i % num_senders == sender_idx`` when
    ``num_senders <= num_receivers`` or ``allow_idle_sender``; else ``[sender_idx % num_receivers]``."""
    if num_senders <= num_receivers or allow_idle_sender:
        return [i for i in range(num_receivers) if i % num_senders == sender_idx]
    return [sender_idx % num_receivers]


def state_dict_to(state_dict: Dict[str, torch.Tensor], dtype: torch.dtype = torch.float16,
                  device: torch.device = torch.device("cpu")) -> Dict[str, torch.Tensor]:
    """The legacy cast: *every* tensor, integer and bool buffers included, to ``dtype`` on ``device``."""
    return OrderedDict((k, v.to(device=device, dtype=dtype)) for k, v in state_dict.items())
