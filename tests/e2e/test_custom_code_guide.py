"""Every python block of migration_guide/custom_code.md runs as written (a colocated toy run of two rounds each, in a
fresh folder) and its extension point does what the page says."""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PAGE = Path(__file__).resolve().parents[2] / "migration_guide" / "custom_code.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
SECTIONS = ["loss", "estimator", "reward", "hook"]


def test_the_page_has_one_example_per_extension_point():
    assert len(BLOCKS) == len(SECTIONS)
    for name, block in zip(SECTIONS, BLOCKS):
        assert PAGE.read_text().index(f'id="{name}"') < PAGE.read_text().index(block), name


@pytest.fixture
def cleanup():
    """Removes what the examples register (the registries are per process)."""
    yield
    from coati_relay import algorithms
    from coati_relay.rewards.registry import _REWARDS

    algorithms.unregister("policy_loss", "plain_pg")
    algorithms.unregister("advantage", "batch_baseline")
    _REWARDS.pop("letter_share", None)


@pytest.mark.parametrize("name", SECTIONS)
def test_the_example_runs(name, tmp_path, monkeypatch, cleanup):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    namespace = {"__name__": f"custom_code_{name}"}
    with contextlib.redirect_stdout(out):
        exec(compile(BLOCKS[SECTIONS.index(name)], f"custom_code.md ({name})", "exec"), namespace)  # noqa: S102
    result = namespace["result"]
    assert len(result.history) == 2 and any(step["grad_norm"] > 0 for step in result.history), "it trained"
    if name == "loss":
        assert not any("clip_frac" in step for step in result.history), "the learner called plain_pg, not ppo_clip"
    if name == "reward":
        assert any(step["reward"] > 0 for step in result.history), "the responses were scored by letter_share"
    if name == "hook":
        lines = [json.loads(line) for line in (tmp_path / "losses.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [1, 2] and result.stopped_early and result.stopped_at == 2
        assert "fit starts" in out.getvalue() and "legacy metrics: {'pg_loss':" in out.getvalue()
