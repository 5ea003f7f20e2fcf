"""Rendezvous that cannot lose its port: many gloo groups formed at once on one host, each port announced only once
its store holds it, and a legacy group whose chosen port was taken meanwhile."""
from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist

from coati_relay.training.rendezvous import given_port_store, host_store, join_store

GROUPS, ROUNDS, TIMEOUT_S = 16, 5, 60


def _grab(port: int):
    """A neighbour's listening socket on ``port`` (as another group's store or gloo pair would hold it), or None
    when the port is held already."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", port))
        sock.listen()
    except OSError:
        sock.close()
        return None
    return sock


def _gloo_sum(store, rank: int, value: float) -> float:
    group = dist.ProcessGroupGloo(store, rank, 2, dist.default_pg_timeout)
    t = torch.tensor([value])
    group.allreduce([t]).wait()
    return t.item()


@pytest.mark.slow
def test_sixteen_groups_at_once_five_times_over_never_lose_their_port():
    """Per round: 16 two-rank groups announce their ports together, a neighbour then tries to take each announced
    port, and every group forms and all-reduces. The old way (a port chosen free, bound when the group forms) loses
    each port to the neighbour."""
    with ThreadPoolExecutor(2 * GROUPS) as pool:
        for _ in range(ROUNDS):
            hosted = [host_store(2, TIMEOUT_S) for _ in range(GROUPS)]
            ports = [h.port for h in hosted]
            neighbours = [_grab(p) for p in ports]
            try:
                taken = [p for p, n in zip(ports, neighbours) if n is not None]
                assert not taken, f"ports announced before their store held them: {taken}"
                firsts = [pool.submit(_gloo_sum, h, 0, 1.0) for h in hosted]
                seconds = [pool.submit(lambda p: _gloo_sum(join_store("127.0.0.1", p, 2, TIMEOUT_S), 1, 2.0), p)
                           for p in ports]
                sums = [f.result(timeout=TIMEOUT_S) for f in firsts + seconds]
            finally:
                for n in neighbours:
                    if n is not None:
                        n.close()
            assert sums == [3.0] * (2 * GROUPS)
            assert len(set(ports)) == GROUPS


class _Board:
    """In-process stand-in for `RayPortBoard` (same methods), recording what was posted."""

    def __init__(self):
        self.posts, self.live = [], {}
        self._changed = threading.Condition()

    def post(self, key, port):
        with self._changed:
            self.posts.append((key, port))
            self.live[key] = port
            self._changed.notify_all()

    def remove(self, key):
        with self._changed:
            self.live.pop(key, None)

    def read(self, key, timeout_s, check=None):
        with self._changed:
            assert self._changed.wait_for(lambda: key in self.live, timeout=timeout_s), f"no post for {key}"
            return self.live[key]

    def members(self, key, ranks):
        return {}  # no rank announced itself (threads, not Ray actors)

    def forget_members(self, key, world_size):
        pass


def _given_port_group(port: int, board) -> list:
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(lambda r: _gloo_sum(given_port_store(r, 2, "127.0.0.1", port, TIMEOUT_S, board), r,
                                                   r + 1.0), r) for r in (0, 1)]
        return [f.result(timeout=TIMEOUT_S) for f in futures]


def test_a_chosen_port_taken_meanwhile_moves_the_group_and_tells_every_rank():
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("", 0))
    squatter.listen()
    chosen = squatter.getsockname()[1]
    board = _Board()
    try:
        assert _given_port_group(chosen, board) == [3.0, 3.0]
    finally:
        squatter.close()
    [(key, bound)] = board.posts
    assert key == f"127.0.0.1:{chosen}/2" and bound != chosen
    assert board.live == {}, "the post outlived the rendezvous: a later group on the same port would read it"


def test_a_free_chosen_port_is_the_one_the_group_meets_on():
    with socket.socket() as s:
        s.bind(("", 0))
        chosen = s.getsockname()[1]
    board = _Board()
    assert _given_port_group(chosen, board) == [3.0, 3.0]
    assert board.posts == [(f"127.0.0.1:{chosen}/2", chosen)]


@pytest.mark.slow
def test_legacy_strategy_ranks_in_ray_meet_although_their_env_info_port_was_taken(ray_cluster):
    """Two Ray actors build a legacy strategy from an ``env_info`` whose port another socket holds; they meet on a
    port rank 0 posts through Ray, as the makers and trainers of a legacy script do."""
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Rank:
        def join(self, env_info):
            from coati_compat.legacy.ray_utils import set_dist_env
            from coati_compat.legacy.strategies import NaiveStrategy

            set_dist_env(env_info)
            NaiveStrategy()
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            return t.item(), dist.get_world_size()

    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("", 0))
    squatter.listen()
    port = str(squatter.getsockname()[1])
    ranks = [Rank.remote() for _ in range(2)]
    try:
        env = [dict(rank=str(r), local_rank="0", world_size="2", master_addr="127.0.0.1", master_port=port)
               for r in range(2)]
        assert ray.get([a.join.remote(e) for a, e in zip(ranks, env)], timeout=300) == [(3.0, 2), (3.0, 2)]
    finally:
        squatter.close()
        for a in ranks:
            ray.kill(a)


@pytest.mark.slow
@pytest.mark.parametrize("dead_rank", [1, 0])
def test_a_rank_that_dies_before_joining_ends_the_rendezvous_within_30s_naming_it(ray_cluster, dead_rank):
    """Legacy ranks (Ray actors given an ``env_info``): one dies in its constructor after `set_dist_env`, before it
    joins. The other stops waiting within 30 s (not after the legacy 30-minute timeout), naming the dead rank."""
    import time

    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Rank:
        def __init__(self, env_info, dies):
            from coati_compat.legacy.ray_utils import set_dist_env

            set_dist_env(env_info)
            if dies:
                raise ValueError("this rank's model_fn failed")
            from coati_compat.legacy.strategies import NaiveStrategy

            self.strategy_class = NaiveStrategy  # imported here: the time measured is the rendezvous'

        def join(self):
            self.strategy_class()

    with socket.socket() as s:
        s.bind(("", 0))
        port = str(s.getsockname()[1])
    env = [dict(rank=str(r), local_rank="0", world_size="2", master_addr="127.0.0.1", master_port=port)
           for r in range(2)]
    ranks = [Rank.remote(env[r], r == dead_rank) for r in range(2)]
    live = ranks[1 - dead_rank]
    try:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(ranks[dead_rank].__ray_ready__.remote(), timeout=90)
        ray.get(live.__ray_ready__.remote(), timeout=90)
        t0 = time.monotonic()  # the other rank is dead already: the error comes from the live one's first look
        with pytest.raises(ray.exceptions.RayTaskError) as caught:
            ray.get(live.join.remote(), timeout=90)
        took = time.monotonic() - t0
        print(f"rank {dead_rank} dead: {took:.1f}s: {str(caught.value).strip().splitlines()[-1][:300]}")
        assert f"rank(s) {dead_rank} died before joining" in str(caught.value)
        assert "this rank's model_fn failed" in str(caught.value)
        assert took < 30
    finally:
        for a in ranks:
            ray.kill(a)
