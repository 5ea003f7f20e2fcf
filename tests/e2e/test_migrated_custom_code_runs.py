"""The migrated custom trainers run: examples/legacy/custom_trainer.py and a second legacy script
(tests/unit/compat/legacy_reinforce_learner.py), each migrated and its ``main()`` run on the toy model (transformers
backend, one round of two optimizer steps). The run trains with the user's loss (registered under the trainer's
class name, RLOO advantages, no critic) and the carried hook writes the legacy callback's lines. A third script
(tests/unit/compat/legacy_actor_critic_learner.py) trains a critic too: its migrated run is PPO with the user's
policy and value losses."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from coati_compat.migrate import migrate_file
from coati_relay.toy import toy_prompt_text

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "custom_trainer": (ROOT / "examples" / "legacy" / "custom_trainer.py", "DetachedPGTrainer",
                       ["--pretrain", "{model}", "--critic_pretrain", "{model}", "--metrics_path", "{log}",
                        "--max_length", "40", "--experience_batch_size", "4", "--train_batch_size", "4"],
                       {"step", "pg_loss", "reward"}),
    "reinforce_learner": (ROOT / "tests" / "unit" / "compat" / "legacy_reinforce_learner.py", "ReinforceLearner",
                          ["--model_path", "{model}", "--log_file", "{log}"], {"loss_value", "mean_reward"}),
}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt"])
        writer.writerows([toy_prompt_text("abcdefgh"[i % 8])] for i in range(16))
    return path


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_migrated_script_trains_with_the_users_loss(name, tiny_model_path, prompts, tmp_path, ray_cluster):
    from coati_relay import algorithms

    legacy, trainer, flags, keys = SCRIPTS[name]
    namespace = {"__name__": f"migrated_{name}"}
    exec(compile(migrate_file(legacy).script, f"migrated {legacy.name}", "exec"), namespace)  # noqa: S102
    log = tmp_path / "log.jsonl"
    argv = [f.format(model=tiny_model_path, log=log) for f in flags]
    argv += ["--prompt_path", str(prompts), "--inference_backend", "transformers", "--run_dir", str(tmp_path / "run")]
    try:
        result = namespace["main"](argv)
        assert algorithms.get("policy_loss", trainer) is namespace[f"{algorithms_name(trainer)}"]
    finally:
        algorithms.unregister("policy_loss", trainer)
    steps = [s for s in result.history if "loss" in s]
    assert steps and all(s["grad_norm"] > 0 for s in steps), "the user's loss trained the policy"
    assert not any("clip_frac" in s for s in steps), "the built-in ppo_clip logs clip_frac; the user's loss does not"
    assert not any("value_loss" in s for s in steps), "no critic"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == len(steps) and all(set(line) == keys for line in lines)
    legacy_loss = next(k for k in keys if "loss" in k)
    assert [line[legacy_loss] for line in lines] == pytest.approx([s["loss"] for s in steps]), \
        "the hook wrote each round's loss under the legacy name"


def algorithms_name(trainer: str) -> str:
    from coati_compat.migrate.custom_code import loss_function_name

    return loss_function_name(trainer)


def test_the_migrated_actor_critic_trains_both_models_with_the_users_losses(tiny_model_path, prompts, tmp_path,
                                                                             ray_cluster):
    """tests/unit/compat/legacy_actor_critic_learner.py migrated: a PPO run of two rounds whose policy and critic
    train with the carried losses (registered under the class's name); both end finite and moved."""
    import torch
    from transformers import AutoModelForCausalLM

    from coati_relay import algorithms

    legacy = ROOT / "tests" / "unit" / "compat" / "legacy_actor_critic_learner.py"
    namespace = {"__name__": "migrated_actor_critic"}
    exec(compile(migrate_file(legacy).script, f"migrated {legacy.name}", "exec"), namespace)  # noqa: S102
    argv = ["--model_path", str(tiny_model_path), "--prompt_path", str(prompts), "--num_episodes", "2",
            "--inference_backend", "transformers", "--run_dir", str(tmp_path / "run")]
    try:
        result = namespace["main"](argv)
        assert algorithms.get("policy_loss", "HuberActorCritic") is namespace["huber_actor_critic_loss"]
        assert algorithms.get("value_loss", "HuberActorCritic") is namespace["huber_actor_critic_value_loss"]
    finally:
        algorithms.unregister("policy_loss", "HuberActorCritic")
        algorithms.unregister("value_loss", "HuberActorCritic")
    steps = [s for s in result.history if "loss" in s]
    assert len(steps) == 2 and all(s["grad_norm"] > 0 and s["value_loss"] > 0 for s in steps)
    assert not any("clip_frac" in s for s in steps), "the built-in ppo_clip logs clip_frac; the user's loss does not"
    before = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    for model, prefix in (("policy", "model."), ("critic", "base.")):  # the critic: the trunk and a value head
        after = torch.load(Path(result.checkpoints[-1]) / model / "model.pt", map_location="cpu")
        assert all(bool(torch.isfinite(t).all()) for t in after.values()), model
        trunk = {k: t for k, t in after.items() if k.startswith(prefix)}
        moved = [k for k, t in trunk.items() if not torch.equal(before["model." + k[len(prefix):]], t)]
        assert len(moved) > len(trunk) // 2, f"{model}: only {len(moved)} of {len(trunk)} tensors moved"
