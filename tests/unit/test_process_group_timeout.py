"""The consumers' data-parallel process group is bounded by the run's ``timeout_s``, not torch's default: a slow
engine start or a long generation must not trip the collective watchdog before the run's own timeout."""
from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from train_round_helpers import make_config

from coati_relay.roles.consumer import ConsumerWorker


class Joined(Exception):
    """Stops the set-up once the process group was asked for (nothing is created)."""


def test_the_runs_timeout_reaches_init_process_group(tiny_model_path, tmp_path, monkeypatch):
    from dataclasses import replace

    from coati_relay.toy import write_toy_dataset

    cfg = make_config(tiny_model_path, str(write_toy_dataset(tmp_path / "p.jsonl", num_prompts=8)), consumers=2)
    cfg = replace(cfg, roles=replace(cfg.roles, timeout_s=1234.0))
    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise Joined

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # an earlier test's group of one may exist
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):  # set on the way: restored after
        monkeypatch.delenv(key, raising=False)
    worker = ConsumerWorker(0, cfg, queue=None, weight_store=None)
    hosted = object()  # the store rank 0's rendezvous() hosts (nothing listens here)
    worker._hosted["group"] = hosted
    with pytest.raises(Joined):
        worker.setup("127.0.0.1", 29512)
    assert seen["timeout"] == datetime.timedelta(seconds=1234.0)
    assert (seen["rank"], seen["world_size"], seen["store"]) == (0, 2, hosted)
