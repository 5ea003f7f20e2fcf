"""What a migrated script holds beside its launch call: its helpers imported from
`coati_relay.migration.from_legacy` (not pasted), the legacy --steps/--seed/--save_dir/--timeout_s mapped, NOTEs
that name `coati-relay docs TOPIC`, and a docstring that names the command the user ran."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from coati_compat.migrate import migrate_file
from coati_compat.migrate.cli import main
from coati_compat.migrate.plugin_defaults import strategy_plugins
from coati_relay.migration import from_legacy, guide

ROOT = Path(__file__).resolve().parents[3]
LEGACY = ROOT / "examples" / "legacy"
FOUR_ROLE = LEGACY / "four_role_ppo.py"


def _csv(path: Path, rows: int) -> str:
    path.write_text("prompt\n" + "".join(f"prompt {i}\n" for i in range(rows)), encoding="utf-8")
    return str(path)


def test_the_engines_strategy_table_is_the_legacy_one():
    assert from_legacy.LEGACY_STRATEGY_PLUGINS == strategy_plugins()


def test_episodes_for_rounds_rounds_up_to_whole_passes(tmp_path):
    csv = _csv(tmp_path / "p.csv", 10)  # 2 rounds of 4 per pass
    assert [from_legacy.episodes_for_rounds(n, csv, 4) for n in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"messages": "a"}\n\n{"messages": "b"}\n', encoding="utf-8")
    assert from_legacy.count_prompts(str(jsonl)) == 2
    with pytest.raises(ValueError, match="fewer prompts than one round takes"):
        from_legacy.episodes_for_rounds(1, csv, 16)
    with pytest.raises(ValueError, match="positive int"):
        from_legacy.episodes_for_rounds(0, csv, 4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_legacy.episodes_for_rounds(1, str(tmp_path / "missing.csv"), 4)


def test_no_state_dict_keeps_the_base_reward_model():
    assert from_legacy.legacy_reward_model("/models/base", None) == "/models/base"


@pytest.mark.parametrize("name", sorted(p.name for p in LEGACY.glob("*.py")))
def test_helpers_are_imported_and_notes_name_the_docs_command(name):
    m = migrate_file(LEGACY / name)
    imports = re.findall(r"^from coati_relay\.migration\.from_legacy import \(?([\w, \n]+?)\)?$", m.script, re.M)
    assert len(imports) == 1 and not re.search(r"^(LEGACY_STRATEGY_PLUGINS|LORA_TARGET_MODULES) = ", m.script, re.M)
    for helper in re.findall(r"\w+", imports[0]):
        assert hasattr(from_legacy, helper) and f"{helper}(" in m.script.split("def build_parser")[1]
        assert f"def {helper}(" not in m.script, f"{helper} is imported, not pasted"
    topics = re.findall(r"\(`coati-relay docs ([\w-]+)`\)", m.script)
    assert len(topics) == len(re.findall(r"^\s*# NOTE:", m.script, re.M)) and set(topics) == {n.topic for n in m.notes}
    for topic in set(topics):
        assert guide.read(topic).startswith(f"(rewriter.md#{topic})")
    assert "migration_guide/" not in m.script and "Written by `coati-relay migrate " in m.script


def test_four_role_steps_seed_save_dir_and_timeout_are_mapped(tmp_path):
    m = migrate_file(FOUR_ROLE)
    assert len(m.script.splitlines()) <= 120
    flags = {"pretrain": "/m", "prompt_csv": _csv(tmp_path / "p.csv", 16), "workers_per_role": 2}
    kw = m.launch_kwargs(flags)  # a round is 2 ranks x 4 prompts: 2 rounds a pass, 4 steps by default
    assert (kw["inference_batch_size"], kw["num_episodes"]) == (8, 2)
    assert m.launch_kwargs({**flags, "steps": 5})["num_episodes"] == 3
    assert m.launch_kwargs({**flags, "steps": 5, "num_episodes": 1})["num_episodes"] == 1, "given: as given"
    assert (kw["seed"], kw["save_dir"], kw["timeout_s"]) == (42, "four_role_ckpt", 600)
    assert kw["train_model_config"] == {"path": "/m", "lora": None}
    assert not any(n.topic == "unused-flags" for n in m.notes)


def test_colossalchat_target_keeps_its_own_helpers_and_drops_the_step_count(tmp_path):
    m = migrate_file(FOUR_ROLE, target="colossalchat")
    assert "coati_relay.migration.from_legacy" not in m.script and "def round_sizes" in m.script
    assert "episodes_for_rounds" not in m.script and "(`coati-relay docs run-length`)" in m.script
    kw = m.launch_kwargs({"pretrain": "/m", "prompt_csv": "absent.csv"})
    assert kw["num_episodes"] == 1 and "seed" not in kw and "timeout_s" not in kw
    assert kw["save_dir"] == "four_role_ckpt" and kw["train_model_config"] == {"path": "/m"}
    assert "--steps" in next(n.text for n in m.notes if n.topic == "unused-flags")
    assert "Written by `coati-relay migrate --target colossalchat four_role_ppo.py`" in " ".join(m.script.split())


def test_the_docstring_names_the_command_that_ran(tmp_path):
    out = tmp_path / "four.py"
    main([str(FOUR_ROLE), "-o", str(out)])
    assert "Written by `python -m coati_compat.migrate four_role_ppo.py`" in " ".join(out.read_text().split())
