"""Which deliberate deviations explain which numbers of a comparison.

Two sources: the rows of ``migration_guide/deviations.md`` that change a measured number (the legacy side runs on
the shims, not on the legacy code) and the rewriter's NOTEs (the migrated side differs from the legacy script).
`DEVIATION_ROWS` names each such row by a phrase of its first cell, with the quantities it moves and when it applies
to a script; `NOTE_QUANTITIES` gives the quantities of each NOTE topic (a test keeps both in step with the guide
and with ``coati_compat.migrate.notes.TOPICS``).
"""
from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Sequence, Set, Tuple

from coati_compat.migrate.notes import Note

DEVIATIONS_PAGE = "migration_guide/deviations.md"

BEHAVIOUR = ("reward", "final_reward", "reward_slope", "kl", "actor_loss", "critic_loss")
SPEED = ("s_per_step", "samples_per_s", "whole_run_s")
EVERYTHING = BEHAVIOUR + SPEED + ("push_s", "peak_memory")


@dataclass(frozen=True)
class ScriptFacts:
    """What decides whether a deviation applies: the names the script uses, its source, its arguments, the host."""

    names: frozenset
    source: str
    args: Tuple[str, ...]
    cuda: bool
    keep_half: bool

    def uses(self, *names: str) -> bool:
        return any(n in self.names for n in names)


def script_facts(source: str, args: Sequence[str], cuda: bool, keep_half: bool) -> ScriptFacts:
    """The facts of a script's source (every name and attribute it mentions) and of its run."""
    names: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name.rpartition(".")[2])
    return ScriptFacts(frozenset(names), source, tuple(args), cuda, keep_half)


def _shim_roles(f: ScriptFacts) -> bool:
    return f.uses("ExperienceMakerHolder", "DetachedPPOTrainer", "DetachedTrainer")


DEVIATION_ROWS: Tuple[Tuple[str, Tuple[str, ...], Callable[[ScriptFacts], bool]], ...] = (
    ("The maker sampled with the legacy token-by-token loop", ("reward", "s_per_step", "samples_per_s", "peak_memory"),
     lambda f: f.uses("ExperienceMakerHolder")),
    ("Inside the actors on a host without CUDA, `.half()` made fp16 models",
     ("s_per_step", "samples_per_s", "peak_memory", "actor_loss", "critic_loss"),
     lambda f: ".half()" in f.source and not f.cuda and not f.keep_half and _shim_roles(f)),
    ("`.half()` models trained under `NaiveStrategy`/`DDPStrategy`", ("actor_loss", "critic_loss"),
     lambda f: ".half()" in f.source and (f.cuda or f.keep_half) and _shim_roles(f)),
    ("KL estimate of the maker in `b5f056636`", ("kl", "reward", "critic_loss"),
     lambda f: f.uses("ExperienceMakerHolder", "NaiveExperienceMaker", "compute_reward", "compute_approx_kl")),
    ("The reward model's score: the final release read the value head", ("reward", "final_reward", "reward_slope"),
     lambda f: f.uses("RewardModel", "get_reward_model_from_args", "BLOOMRM", "GPTRM", "OPTRM", "LlamaRM")),
    ("`DetachedReplayBuffer(limit=n)` blocked only the trainer's", ("s_per_step", "samples_per_s", "peak_memory"),
     lambda f: f.uses("DetachedPPOTrainer", "DetachedTrainer")),
    ("The weight push sent `chunk_end` without waiting", ("push_s",), lambda f: f.uses("DetachedPPOTrainer")),
    ("`DetachedPPOTrainer` pushed each shard to the makers", ("push_s",), lambda f: f.uses("DetachedPPOTrainer")),
    ("Optimizers had `lr=1e-7`", ("reward_slope", "final_reward", "kl"), lambda f: f.uses("DetachedPPOTrainer")),
    ("GPU-era Ray scripts with their own actors", ("s_per_step", "samples_per_s", "peak_memory"),
     lambda f: not f.cuda),
    ("LowLevelZero and Gemini need CUDA.", ("s_per_step", "peak_memory", "actor_loss", "critic_loss"),
     lambda f: not f.cuda and any("zero" in a or "gemini" in a for a in f.args)),
)

NOTE_QUANTITIES: Dict[str, Tuple[str, ...]] = {
    "routing": (),
    "placement": SPEED + ("peak_memory",),
    "env-info": (),
    "maker-strategy": ("peak_memory",),
    "trainer-strategy": SPEED + ("peak_memory",),
    "models": ("reward", "final_reward", "reward_slope", "critic_loss"),
    "initial-model": ("kl",),
    "lora": ("push_s", "peak_memory") + BEHAVIOUR,
    "learning-rate": BEHAVIOUR,
    "kl-and-advantages": BEHAVIOUR,
    "generation": ("reward",) + SPEED,
    "batch-sizes": SPEED,
    "run-length": ("whole_run_s",),
    "train-epochs": ("actor_loss", "critic_loss"),
    "buffer": SPEED + ("peak_memory",),
    "initial-sync": ("whole_run_s",),
    "callbacks": (),
    "trackers": (),
    "dataset": ("reward", "final_reward", "reward_slope"),
    "custom-classes": EVERYTHING,
    "four-role": EVERYTHING,
    "unused-flags": (),
    "seed-and-save-dir": (),
    "unread": EVERYTHING,
    "ppo-to-grpo": BEHAVIOUR,  # no critic, group-normalised advantages: every learning curve changes
    "rewards": ("reward", "final_reward", "reward_slope"),  # a rule reward instead of the reward model
}


@dataclass
class Explanation:
    """One deviation or NOTE: a tag for the tables (``D1``, ``N1``), its text, where it is documented, and the
    quantities it explains (empty: it explains no measured number)."""

    tag: str
    text: str
    link: str
    quantities: Tuple[str, ...]

    def to_json(self) -> dict:
        return asdict(self)


def _first_cell(guide_text: str, phrase: str) -> str:
    for line in guide_text.splitlines():
        if line.startswith("| ") and phrase in line.split(" | ")[0]:
            return line.split(" | ")[0].lstrip("| ").strip()
    raise ValueError(f"{DEVIATIONS_PAGE} has no row starting with {phrase!r}; update DEVIATION_ROWS")


def deviation_explanations(guide_text: str, facts: ScriptFacts) -> List[Explanation]:
    """The rows of ``deviations.md`` (its text: ``guide_text``) that apply to this script and move a number."""
    rows = [(phrase, quantities) for phrase, quantities, applies in DEVIATION_ROWS if applies(facts)]
    return [Explanation(f"D{i}", _first_cell(guide_text, phrase), DEVIATIONS_PAGE, quantities)
            for i, (phrase, quantities) in enumerate(rows, start=1)]


def note_explanations(notes: Sequence[Note], idle_topics: Sequence[str] = ()) -> List[Explanation]:
    """The rewriter's NOTEs, each with the quantities of its topic; topics in ``idle_topics`` (e.g. ``lora`` for a
    run without LoRA) explain nothing in this run."""
    return [Explanation(f"N{i}", note.text, note.link, () if note.topic in idle_topics
                        else NOTE_QUANTITIES[note.topic]) for i, note in enumerate(notes, start=1)]


def idle_topics(launch_kwargs: Dict) -> List[str]:
    """NOTE topics that cannot move a number of a run with these ``launch_distributed`` keywords."""
    return [] if (launch_kwargs.get("train_model_config") or {}).get("lora") else ["lora"]
