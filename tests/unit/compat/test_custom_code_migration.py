"""The rewriter carries a script's own code: a ``DetachedTrainer`` subclass's ``training_step`` becomes a policy loss
registered under the class's name, a ``TrainerCallback`` subclass a hook class. Two scripts: the example
(examples/legacy/custom_trainer.py) and a fixture with other names and another loss (legacy_reinforce_learner.py)."""
from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

from coati_compat.migrate import migrate_file, migrate_source
from coati_compat.migrate.cli import EXIT_OK, EXIT_PARTIAL, main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "legacy" / "custom_trainer.py"
FIXTURE = Path(__file__).resolve().parent / "legacy_reinforce_learner.py"
# script -> (trainer class, loss function, callback class, legacy metrics -> the engine's metric names)
CASES = {EXAMPLE: ("DetachedPGTrainer", "detached_pg_trainer_loss", "MetricsWriter",
                   {"pg_loss": "loss", "reward": "reward"}),
         FIXTURE: ("ReinforceLearner", "reinforce_learner_loss", "JsonlLog",
                   {"loss_value": "loss", "mean_reward": "reward"})}


def _masked_mean(x, m, dim):
    return (x * m).sum(dim) / (m.sum(dim) + 1e-8)


def hand_loss(script: Path, logp, adv, mask):
    """The legacy training step's loss, written out: [B,T] log-probs, [B,1] advantages, [B,T] mask."""
    seq = _masked_mean(logp, mask, 1)
    if script == EXAMPLE:
        return -(adv.squeeze(-1) * seq).mean()
    return -(adv.squeeze(-1).clamp(-2.0, 2.0) * seq).mean() + 0.01 * (seq ** 2).mean()


def load(script: Path) -> dict:
    namespace = {"__name__": "migrated_under_test"}
    exec(compile(migrate_file(script).script, f"migrated {script.name}", "exec"), namespace)  # noqa: S102
    return namespace


def legacy_class(script: Path, name: str):
    """A class of the legacy script, from its source, with the legacy callback base."""
    from coati_compat.legacy.callbacks import TrainerCallback

    cls = next(n for n in ast.parse(script.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)
    namespace = {"TrainerCallback": TrainerCallback, "json": json}
    exec(compile(ast.Module(body=[cls], type_ignores=[]), script.name, "exec"), namespace)  # noqa: S102
    return namespace[name]


@pytest.mark.parametrize("script", list(CASES), ids=lambda p: p.stem)
def test_migrates_completely_with_the_loss_named_after_the_class(script, tmp_path):
    trainer, function, _, _ = CASES[script]
    assert main([str(script), "-o", str(tmp_path)]) == EXIT_OK
    m = migrate_file(script)
    assert m.complete and "NOT TRANSLATED" not in m.script
    kw = m.launch_kwargs({"prompt_path": "p.csv"})
    assert kw["grpo_config"]["policy_loss"] == trainer and kw["grpo_config"]["beta"] == 0.0
    assert (kw["core_algo"], kw["num_generations"]) == ("RLOO", 2) and "critic_model_config" not in kw
    assert f'register("policy_loss", "{trainer}")({function})' in m.script


@pytest.mark.parametrize("script", list(CASES), ids=lambda p: p.stem)
def test_the_carried_loss_is_the_legacy_computation_over_micro_batches(script):
    """Called on two micro-batches as the learner does (num_samples: the whole step's), the losses add up to the
    legacy step's loss over the batch, and so do their gradients."""
    fn = load(script)[CASES[script][1]]
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(6, 5, generator=g).requires_grad_()
    old, adv = torch.randn(6, 5, generator=g), 3 * torch.randn(6, 1, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1
    expected = hand_loss(script, logp, adv, mask)
    (want,) = torch.autograd.grad(expected, logp)
    total = sum(fn(logp[s], old[s], adv[s], mask[s], num_samples=6.0, beta=0.0, per_token_kl=None)[0]
                for s in (slice(0, 2), slice(2, 6)))
    (got,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(expected.item(), rel=1e-6) and abs(expected.item()) > 1e-3
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("script", list(CASES), ids=lambda p: p.stem)
def test_the_hook_writes_what_the_legacy_callback_wrote(script, tmp_path):
    """The carried hook on the engine's round record and the legacy callback on the legacy step's metrics write
    the same file."""
    _, _, callback, names = CASES[script]
    record = {"step": 1, "time": 0.0, "loss": 0.25, "reward": 0.5, "grad_norm": 1.0}
    legacy_metrics = {legacy: record[engine] for legacy, engine in names.items()}
    hook = load(script)[callback](str(tmp_path / "migrated.jsonl"))
    old = legacy_class(script, callback)(str(tmp_path / "legacy.jsonl"))
    for obj, start in ((hook, "on_run_start"), (old, "on_fit_start")):
        getattr(obj, start, lambda *a: None)(*(() if obj is old else (None,)))
    for _ in range(2):
        hook.on_round_end(1, record)
        old.on_batch_end(dict(legacy_metrics), None)
    assert (tmp_path / "migrated.jsonl").read_text() == (tmp_path / "legacy.jsonl").read_text() != ""


def test_every_adapted_line_has_a_note():
    """Each line of the example's training_step that changed or went away is named in a NOTE of the loss."""
    script = migrate_file(EXAMPLE).script
    body = script[script.index("def detached_pg_trainer_loss"):script.index("def build_parser")]
    for line in (63, 64, 65, 66, 67, 68, 69, 70, 71):
        assert f"(line {line})" in body, line
    code = [line for line in body.splitlines() if not line.lstrip().startswith("#")]
    assert "    log_probs = logp" in code and not any("backward(" in line or "optim." in line for line in code)
    fixture = re.sub(r"\s*\n\s*#\s*", " ", migrate_file(FIXTURE).script)  # NOTE lines joined
    assert "on_episode_end (legacy line" in fixture and "never called; the closest hook is on_round_end" in fixture
    assert "def legacy_on_episode_end(self, episode):" in fixture, "renamed: launch_distributed refuses on_* lookalikes"
    assert "the metric 'adv'" in fixture, "a metric without a counterpart is named"


UNCARRIED = textwrap.dedent('''
    import ray
    from coati.ray.detached_trainer_base import DetachedTrainer
    from coati.ray.experience_maker_holder import ExperienceMakerHolder


    class ValueTrainer(DetachedTrainer):
        def training_step(self, experience):
            loss = ((self.critic(experience.sequences) - experience.values) ** 2).mean()
            loss.backward()
            return {"loss": loss.item()}


    class MyMaker(ExperienceMakerHolder):
        def _make_experience(self, inputs):
            return inputs


    maker = MyMaker.options(name="m").remote(detached_trainer_name_list=["t"], model_fn=None)
    trainer = ValueTrainer.options(name="t").remote(experience_maker_holder_name_list=["m"])
''')


def test_what_cannot_be_carried_is_one_note_each_naming_the_closest_extension_point(tmp_path):
    m = migrate_source(UNCARRIED, "uncarried.py")
    assert len(m.untranslated) == 2
    trainer = next(u for u in m.untranslated if "ValueTrainer" in u)
    maker = next(u for u in m.untranslated if "MyMaker" in u)
    assert "ValueTrainer" in trainer and "does not get: experience.sequences" in trainer and "custom_code.md" in trainer
    assert "MyMaker" in maker and "register_reward" in maker and "register_estimator" in maker
    path = tmp_path / "uncarried.py"
    path.write_text(UNCARRIED)
    assert main([str(path), "-o", str(tmp_path / "out")]) == EXIT_PARTIAL


def test_colossalchat_target_keeps_carried_code_not_translated():
    m = migrate_file(EXAMPLE, target="colossalchat")
    assert not m.complete and "callbacks" in m.untranslated[-1] and "callbacks=[" not in m.script.split("def main")[1]
