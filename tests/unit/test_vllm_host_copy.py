"""`VLLMBackend.load_weights` without an engine (a stand-in records the reload): a whole version becomes the host copy
as it came (the buffers a collective sync received: no second copy), a partial one merges into a private copy and
never writes into the given tensors."""
from __future__ import annotations

import torch
from packaging.version import Version

from coati_relay.inference.vllm_backend import VLLMBackend


class RecordingEngine:
    def __init__(self):
        self.reloads = []

    def collective_rpc(self, method, timeout=None, kwargs=None):
        self.reloads.append(dict(kwargs["weights_iterator"]))

    def reset_prefix_cache(self):
        pass


def _backend(weights):
    backend = VLLMBackend.__new__(VLLMBackend)
    backend.llm, backend.vllm_version = RecordingEngine(), Version("0.32.0")
    backend.sleeps = backend.asleep = False
    backend._host_weights = weights
    backend._shapes = {k: v.shape for k, v in weights.items()}
    backend._adopted = False
    backend.weight_version = 0
    return backend


def test_a_whole_version_becomes_the_host_copy_without_a_second_copy():
    backend = _backend({"a": torch.zeros(2, 3), "b": torch.zeros(4)})
    version = {"a": torch.ones(2, 3), "b": torch.full((4,), 2.0)}
    backend.load_weights(1, version)
    assert all(backend._host_weights[k].data_ptr() == t.data_ptr() for k, t in version.items()), "copied"
    assert backend.llm.reloads[-1]["b"].data_ptr() == version["b"].data_ptr()
    backend.load_weights(2, {"a": torch.full((2, 3), 5.0)})  # partial: merged into a private copy
    assert torch.equal(version["a"], torch.ones(2, 3)), "the given tensors are never written"
    assert torch.equal(backend.llm.reloads[-1]["a"], torch.full((2, 3), 5.0))
    assert torch.equal(backend.llm.reloads[-1]["b"], torch.full((4,), 2.0))
    assert backend.weight_version == 2
