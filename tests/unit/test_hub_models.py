"""Models named by Hugging Face Hub ID: resolved in the driver through a real cache layout (built here, in a temporary
HF_HUB_CACHE or HF_HOME), before any actor starts; absent and offline, an error that names the ID and the fetch
command. Nothing here reaches the Hub: the cache is local, and the online cases point HF_ENDPOINT at a closed local
port."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from small_run import small_run_kwargs

from coati_relay.assembly.build import ConfigError, build_run_config
from coati_relay.config.hub import is_hub_id
from coati_relay.toy import cache_as_hub_model

REPO = "toy-org/tiny-qwen"
CLOSED_PORT = "http://127.0.0.1:9"  # discard port: refused at once, never the Hub


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-home" / "hub"
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_PORT)
    return cache




def test_the_cache_entry_has_the_hub_layout(hub_cache, tiny_model_path):
    snapshot = cache_as_hub_model(tiny_model_path, REPO)
    repo = hub_cache / "models--toy-org--tiny-qwen"
    commit = (repo / "refs" / "main").read_text()
    assert snapshot == repo / "snapshots" / commit and len(commit) == 40
    config = snapshot / "config.json"
    assert config.is_symlink() and config.resolve().parent == (repo / "blobs").resolve()
    assert config.read_bytes() == (Path(tiny_model_path) / "config.json").read_bytes()


def test_an_id_in_the_cache_resolves_offline_for_every_role(hub_cache, tiny_model_path, tmp_path):
    snapshot = str(cache_as_hub_model(tiny_model_path, REPO))
    cfg = build_run_config(**small_run_kwargs(tmp_path, REPO, tokenizer_config={"path": REPO}))
    m = cfg.models
    assert m.model_path == m.train_path == m.tokenizer_path == snapshot
    assert cfg.data.num_prompts == 8, "the dataset was tokenized with the cached tokenizer"


def test_hf_home_locates_the_cache_when_hf_hub_cache_is_unset(hub_cache, tiny_model_path, tmp_path, monkeypatch):
    home = tmp_path / "other-home"
    snapshot = str(cache_as_hub_model(tiny_model_path, REPO, cache_dir=home / "hub"))
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(home))
    assert build_run_config(**small_run_kwargs(tmp_path, REPO)).models.model_path == snapshot


def test_a_critic_and_reward_model_by_id_resolve_too(hub_cache, tiny_model_path, tmp_path):
    snapshot = str(cache_as_hub_model(tiny_model_path, REPO))
    cfg = build_run_config(**small_run_kwargs(tmp_path, tiny_model_path, core_algo="PPO",
                                           critic_model_config={"path": REPO}))
    assert cfg.models.critic_model_path == snapshot and cfg.models.model_path == tiny_model_path


def test_an_id_absent_offline_names_the_id_and_the_fetch_command(hub_cache, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_run_config(**small_run_kwargs(tmp_path, "toy-org/absent-model"))
    msg = str(err.value)
    assert "inference_model_config['path'] = 'toy-org/absent-model'" in msg
    assert "hf download toy-org/absent-model" in msg and "huggingface-cli download toy-org/absent-model" in msg
    assert "HF_HUB_OFFLINE" in msg and str(hub_cache) in msg


def test_online_a_cached_id_is_used_without_asking_the_hub(hub_cache, tiny_model_path, tmp_path, monkeypatch):
    snapshot = str(cache_as_hub_model(tiny_model_path, REPO))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert build_run_config(**small_run_kwargs(tmp_path, REPO)).models.model_path == snapshot


def test_online_a_failed_download_names_the_id(hub_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(ConfigError) as err:
        build_run_config(**small_run_kwargs(tmp_path, "toy-org/absent-model"))
    assert "'toy-org/absent-model'" in str(err.value) and "downloading it" in str(err.value)
    assert "hf download toy-org/absent-model" in str(err.value)


def test_a_local_directory_wins_over_an_id_of_the_same_name(hub_cache, tiny_model_path, tmp_path, monkeypatch):
    cache_as_hub_model(tiny_model_path, REPO)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy-org").mkdir()
    os.symlink(tiny_model_path, tmp_path / REPO)
    assert build_run_config(**small_run_kwargs(tmp_path, REPO)).models.model_path == REPO


@pytest.mark.parametrize("value, expected", [
    ("Qwen/Qwen2.5-7B", True), ("gpt2", True), ("/abs/model", False), ("./model", False), ("~/model", False),
    ("a/b/c", False), ("org/bad name", False), ("", False)])
def test_what_reads_as_a_hub_id(value, expected):
    assert is_hub_id(value) is expected
