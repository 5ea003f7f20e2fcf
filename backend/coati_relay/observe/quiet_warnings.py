"""Filters for third-party warnings every run on a host without the optional CUDA extras prints, and that no user
can act on: each matches one known message from one known place, so every other warning (the engine's own
`HostDifferenceWarning`, the compat layer's deprecations, a library's new warnings) still shows. Installed when
`coati_relay` is imported."""
from __future__ import annotations

import warnings

# (message regex, category, module regex: where the warning is attributed; "" for anywhere)
KNOWN_NOISE = (
    # ColossalAI's async checkpoint writer, unused here
    (r"Please install the latest tensornvme to use async save", UserWarning, r"colossalai\.utils\.safetensors"),
    # ColossalAI's fused RMSNorm, once per class (two of them)
    (r"Please install apex from source \(https://github\.com/NVIDIA/apex\) to use the fused RMSNorm kernel",
     UserWarning, r"colossalai\.shardformer\.layer\.normalization"),
    # torch's DDP, on the broadcast_buffers keyword ColossalAI's TorchDDPPlugin passes
    (r"`broadcast_buffers` is deprecated\. Use `forward_sync_buffers` instead", FutureWarning, ""),
)


def install() -> None:
    """Adds the `KNOWN_NOISE` filters to `warnings` (idempotent: `warnings.filterwarnings` drops duplicates)."""
    for message, category, module in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
