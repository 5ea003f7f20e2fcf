"""The deviations and NOTEs that ``coati-relay compare`` puts beside its numbers stay in step with the guide and the
rewriter, and pick the rows that apply to each example; the command refuses bad input with a clear message."""
from __future__ import annotations

from pathlib import Path

import pytest

from coati_compat.compare import cli, explanations
from coati_compat.compare.report import tags_for
from coati_compat.migrate.notes import TOPICS, Note
from coati_compat.migrate.rewrite import migrate_file

ROOT = Path(__file__).resolve().parents[3]
GUIDE = (ROOT / explanations.DEVIATIONS_PAGE).read_text(encoding="utf-8")
EXAMPLES = ROOT / "examples" / "legacy"


def facts(name, args=(), cuda=False, keep_half=False):
    return explanations.script_facts((EXAMPLES / name).read_text(encoding="utf-8"), args, cuda, keep_half)


def test_every_named_row_is_in_the_guide_and_every_topic_has_quantities():
    everything = explanations.ScriptFacts(frozenset({"ExperienceMakerHolder", "DetachedPPOTrainer", "RewardModel"}),
                                          ".half()", ("colossalai_zero2",), cuda=False, keep_half=False)
    for phrase, quantities, _ in explanations.DEVIATION_ROWS:
        assert phrase in explanations._first_cell(GUIDE, phrase)
        assert quantities and set(quantities) <= set(explanations.EVERYTHING)
    assert len(explanations.deviation_explanations(GUIDE, everything)) == len(explanations.DEVIATION_ROWS) - 1
    assert set(explanations.NOTE_QUANTITIES) == set(TOPICS)
    with pytest.raises(ValueError, match="no row starting with"):
        explanations._first_cell(GUIDE, "a row that is not there")


def test_rows_that_apply_to_the_examples():
    many = {e.text[:30] for e in explanations.deviation_explanations(GUIDE, facts("ppo_many_roles.py"))}
    assert any(t.startswith("The maker sampled") for t in many)
    assert any(t.startswith("Inside the actors on a host") for t in many), ".half() keeps fp32 on CPU"
    assert any(t.startswith("Optimizers had `lr=1e-7`") for t in many)
    four = explanations.deviation_explanations(GUIDE, facts("four_role_ppo.py"))
    texts = [e.text for e in four]
    assert any(t.startswith("KL estimate of the maker") for t in texts), "compute_reward"
    assert not any(t.startswith("The maker sampled") for t in texts), "no shim maker"
    assert [e.tag for e in four] == [f"D{i}" for i in range(1, len(four) + 1)]
    with_cuda = explanations.deviation_explanations(GUIDE, facts("ppo_many_roles.py", cuda=True))
    assert not any(e.text.startswith("GPU-era Ray scripts") for e in with_cuda)


def test_notes_carry_their_topics_quantities():
    notes = migrate_file(EXAMPLES / "ppo_many_roles.py").notes
    found = explanations.note_explanations(notes)
    assert [e.tag for e in found] == [f"N{i}" for i in range(1, len(notes) + 1)]
    kl = next(e for e in found if "GAE" in e.text)
    assert "kl" in kl.quantities and kl.link.endswith("#kl-and-advantages")
    assert tags_for([e.to_json() for e in found], "kl")
    assert not tags_for([e.to_json() for e in explanations.note_explanations([Note("routing", "x")])], "kl")


@pytest.mark.parametrize("words, message", [
    (["nothere.py", "--"], "nothere.py is not a file"),
    ([str(EXAMPLES / "four_role_ppo.py"), "--steps", "2"], "put the legacy script's arguments after --"),
    ([str(EXAMPLES / "four_role_ppo.py"), "--reuse-legacy", "nowhere", "--"], "no compare.json there"),
])
def test_bad_input_is_refused_with_what_to_do(words, message, capsys):
    assert cli._run(cli.argparse.Namespace(words=words)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_bad_steps_are_refused(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse(["x.py", "--steps", value, "--"])
    assert exit_info.value.code == 2
    assert f"--steps must be a positive int, got '{value}'" in capsys.readouterr().err


def test_script_arguments_follow_the_separator():
    args = cli.parse(["x.py", "--steps", "4", "--", "--steps", "9", "--lr", "1"])
    assert args.steps == 4 and args.script_args == ["--steps", "9", "--lr", "1"]
    assert cli.parse(["x.py", "--"]).script_args == []
