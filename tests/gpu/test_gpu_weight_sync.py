"""``weight_sync="collective"`` on CUDA: consumer rank 0 (training on its GPU) broadcasts every version to the
producer, which generates on its GPU with each one in lock-step; what the producer receives is what was sent, value
for value. Members sharing a GPU (the lane's own cluster declares one device as two logical GPUs) use gloo, which
works there; NCCL, which refuses that, only where every member has a GPU of its own."""
from __future__ import annotations

import textwrap
import threading

import torch
from gpu_lane import MARKS, needs_cluster_gpus, needs_devices, run_kwargs, run_ranks

from coati_relay.training.distributed import free_port

pytestmark = MARKS


def test_collective_weight_sync_on_cuda(gpu_ray_cluster, tiny_model_path, data, tmp_path):
    from coati_relay import launch_distributed

    needs_cluster_gpus(gpu_ray_cluster, 2)
    result = launch_distributed(**run_kwargs(tiny_model_path, data, tmp_path / "coll", "GRPO", "transformers",
                                             num_episodes=2, weight_sync="collective"))
    assert [h["version"] for h in result.history] == [1, 2, 3, 4]
    assert all(h["rollout_version_min"] == h["version"] - 1 for h in result.history), "lock-step over broadcasts"
    assert all(h["weight_bytes"] > 0 for h in result.history)


def test_two_members_on_one_gpu_broadcast_over_gloo():
    from coati_relay.exchange.weight_sync_collective import WeightGroup
    from coati_relay.training.rendezvous import host_store, join_store

    hosted = host_store(2, timeout_s=60)
    groups = {}
    joiner = threading.Thread(target=lambda: groups.setdefault(1, WeightGroup(
        join_store("127.0.0.1", hosted.port, 2, 60), 1, 2, 60)))
    joiner.start()
    groups[0] = WeightGroup(hosted, 0, 2, 60)
    joiner.join(timeout=60)
    assert groups[0].backend == groups[1].backend == "gloo", "NCCL refuses two ranks on one GPU"
    sent = {"bfloat16": torch.randn(1000, device="cuda").bfloat16(), "float32": torch.randn(77, device="cuda")}
    received = {dt: torch.empty_like(b, device=groups[1].device) for dt, b in sent.items()}
    worker = threading.Thread(target=groups[1].broadcast, args=(received,))
    worker.start()
    groups[0].broadcast({dt: b.to(groups[0].device) for dt, b in sent.items()})
    worker.join(timeout=60)
    for dt, b in sent.items():
        assert torch.equal(received[dt].cpu(), b.cpu()), dt


def test_collective_sync_delivers_a_trained_models_weights_value_for_value(gpu_ray_cluster, tiny_model_path):
    """The publisher and subscriber of ``weight_sync="collective"`` with a model's CUDA weights (perturbed, so not the
    file's): the producer receives every tensor with its name, dtype and values, and a model loading them computes
    the publisher's logits exactly."""
    from transformers import AutoModelForCausalLM

    from coati_relay.exchange.weight_store import make_weight_store
    from coati_relay.exchange.weight_sync_collective import CollectivePublisher, CollectiveSubscriber
    from coati_relay.training.rendezvous import host_store

    def model(dtype):
        return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=dtype).cuda().eval()

    store, hosted, made = make_weight_store(), host_store(2, timeout_s=60), {}
    joiner = threading.Thread(target=lambda: made.setdefault("sub", CollectiveSubscriber(
        store, "127.0.0.1", hosted.port, 1, 2, 1, timeout_s=60)))
    joiner.start()
    publisher = CollectivePublisher(store, hosted, 2, timeout_s=60)
    joiner.join(timeout=60)
    ids = torch.randint(2, 300, (2, 12), generator=torch.Generator().manual_seed(0)).cuda()
    for version, dtype in ((1, torch.float32), (2, torch.bfloat16)):
        trained = model(dtype)
        with torch.no_grad():
            for p in trained.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        sent = {k: v.detach().clone() for k, v in trained.state_dict().items()}
        publisher.publish(version, tensors={k: v.to(publisher.device) for k, v in sent.items()})
        got_version, got = made["sub"].fetch(version, timeout_s=60)
        assert got_version == version and set(got) == set(sent)
        for k, v in sent.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k].cpu(), v.cpu()), k
        receiver = model(dtype)
        receiver.load_state_dict({k: v.cuda() for k, v in got.items()})
        with torch.no_grad():
            assert torch.equal(receiver(input_ids=ids).logits, trained(input_ids=ids).logits)


_MEMBER = textwrap.dedent("""
    import sys, torch
    from coati_relay.training.rendezvous import host_store, join_store
    from coati_relay.exchange.weight_sync_collective import WeightGroup
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.cuda.set_device(rank)
    store = host_store(world, 60, port=port) if rank == 0 else join_store("127.0.0.1", port, world, 60)
    group = WeightGroup(store, rank, world, 60)
    buffers = {"float32": torch.arange(10, dtype=torch.float32, device="cuda") if rank == 0 else
               torch.zeros(10, device="cuda")}
    group.broadcast(buffers)
    print("BACKEND", group.backend, "SUM", float(buffers["float32"].sum()))
""")


@needs_devices(2)
def test_members_on_their_own_gpus_broadcast_over_nccl(tmp_path):
    (tmp_path / "member.py").write_text(_MEMBER)
    outputs = run_ranks(tmp_path / "member.py", 2, [str(free_port())], timeout_s=180)
    for out in outputs:
        assert "BACKEND nccl SUM 45.0" in out, out[-2000:]
