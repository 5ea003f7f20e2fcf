"""start_local_ray: the cluster a run starts for itself has no dashboard and no Ray metrics, unless
$RAY_enable_metrics_collection says otherwise."""
from __future__ import annotations

from coati_relay.cluster import local_ray


def _init_keywords(monkeypatch, **kwargs):
    import ray

    seen = {}
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    local_ray.start_local_ray(**kwargs)
    return seen


def test_metrics_are_off_by_default(monkeypatch):
    monkeypatch.delenv(local_ray.METRICS_ENV, raising=False)
    seen = _init_keywords(monkeypatch, num_cpus=4)
    assert seen == {"include_dashboard": False, "log_to_driver": False, "num_cpus": 4,
                    "_system_config": {"enable_metrics_collection": False}}


def test_the_environment_variable_is_followed(monkeypatch):
    monkeypatch.setenv(local_ray.METRICS_ENV, "1")
    seen = _init_keywords(monkeypatch, log_to_driver=True)
    assert seen["_system_config"] == {} and seen["log_to_driver"] is True
