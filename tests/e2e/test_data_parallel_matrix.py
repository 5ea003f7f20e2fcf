"""Two data-parallel consumers train in every shape a user or the rewriter writes: a pairwise matrix over the
algorithm (with a critic: PPO), the reward (a model or a function), responses per prompt (1 or 4), optimizer steps
per round (1 or 2), ``ppo_epochs`` (1 or 2) and top-k (on or off), on a tiny Llama with real Ray actors. Each run ends
with weights that are finite, moved, and equal on both ranks (`RunResult.consumer_stats`' digests). The first row is
the call `coati-relay migrate` wrote for a two-maker, two-trainer legacy script, which hung in its second round;
the last one plants a stuck rank and checks that the run ends within the collective timeout, naming it."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPTS = 64
# (id, core_algo, responses a prompt, reward, optimizer steps a round, ppo_epochs, top_k)
MATRIX = [
    ("migrated-ppo", "PPO", 1, "model", 2, 1, 50),
    ("ppo", "PPO", 4, "function", 1, 2, 0),
    ("grpo-rm", "GRPO", 4, "model", 1, 1, 0),
    ("grpo", "GRPO", 4, "function", 2, 2, 50),
    ("dapo", "DAPO", 4, "function", 1, 1, 50),
    ("dapo-rm", "DAPO", 4, "model", 2, 2, 0),
    ("rloo-rm", "RLOO", 4, "model", 2, 1, 50),
    ("rloo", "RLOO", 4, "function", 1, 2, 0),
    ("reinforce-ppb", "REINFORCE_PPB", 1, "function", 1, 2, 0),
    ("reinforce-ppb-rm", "REINFORCE_PPB", 4, "model", 2, 1, 50),
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from coati_relay.toy import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("dp") / "llama", arch="llama"))


@pytest.fixture(scope="module")
def prompts_csv(tmp_path_factory):
    """A legacy prompt file: 64 prompts, with repeats (as real prompt files have), and their answers."""
    from coati_relay.toy import toy_prompt_text

    path = tmp_path_factory.mktemp("dp") / "prompts.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "gt_answer"])
        for i in range(PROMPTS):
            writer.writerow([toy_prompt_text("ab"[i % 2]), "ab"[i % 2]])
    return str(path)


def _kwargs(model, data, run_dir, algo, group, reward, steps, epochs, top_k, rounds=2, **over):
    """Two producers of 4 prompts a round each, two consumers; ``steps`` optimizer steps a round on each rank."""
    per_rank = 4  # prompts a round on each consumer: 2 producers x 4 prompts / 2 consumers
    legacy = algo == "PPO" and group == 1
    grpo = {"lr": 1e-07 if legacy else 5e-3, "critic_lr": 1e-07 if legacy else 5e-3, "ppo_epochs": epochs,
            "lr_scheduler": "constant"}
    grpo.update({"kl_coef": 0.1} if algo == "PPO" else {"beta": 0.01 if algo != "DAPO" else 0.0})
    extra = {}
    if reward == "model":
        extra["reward_model_config"] = {"path": model}
    else:
        grpo["reward_fn_type"] = "toy_letter"
    if algo == "PPO":
        extra["critic_model_config"] = {"path": model}
    generate = {"max_new_tokens": 32, "temperature": 1.0} if legacy else \
        {"max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}
    if top_k:
        generate["top_k"] = top_k
    kw = dict(num_producers=2, num_proc_per_producer=1, num_consumer_procs=2, num_episodes=1,
              inference_batch_size=4, inference_microbatch_size=4, train_batch_size=per_rank // steps,
              train_minibatch_size=per_rank // steps,
              train_dataset_config={"path": data, "max_length": 16}, train_model_config={"path": model},
              inference_model_config={"path": model}, generate_config=generate, grpo_config=grpo,
              plugin_config={"plugin": "ddp"}, inference_backend="transformers", num_generations=group,
              core_algo=algo, run_dir=str(run_dir), progress=False, save_interval=1000, timeout_s=120,
              **extra)
    kw.update(over)
    # 8 prompts a round, 64 prompts an episode: `rounds` rounds are a slice of one episode
    kw["train_dataset_config"] = {**kw["train_dataset_config"], "path": _first(data, 8 * rounds, run_dir)}
    return kw


def _first(data: str, n: int, run_dir: Path) -> str:
    """The first ``n`` prompts of the CSV, in a file of their own beside the run."""
    lines = Path(data).read_text().splitlines()
    out = Path(str(run_dir) + "-prompts.csv")
    out.write_text("\n".join(lines[:n + 1]) + "\n")
    return str(out)


def _state(path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(Path(path).glob("*.safetensors")) for k, v in load_file(str(f)).items()}


@pytest.mark.parametrize("row", MATRIX, ids=[r[0] for r in MATRIX])
def test_two_consumers_train_equal_finite_moved_weights(ray_cluster, llama, prompts_csv, tmp_path, row):
    from coati_relay import launch_distributed

    name, algo, group, reward, steps, epochs, top_k = row
    rounds = 8 if name == "migrated-ppo" else 2
    started = time.monotonic()
    result = launch_distributed(**_kwargs(llama, prompts_csv, tmp_path / name, algo, group, reward, steps, epochs,
                                          top_k, rounds=rounds))
    seconds = time.monotonic() - started
    assert [h["step"] for h in result.history] == list(range(1, rounds + 1))
    assert all(h["skipped_steps"] == 0 for h in result.history if "skipped_steps" in h), "every round trained"
    digests = [s["weights_digest"] for s in result.consumer_stats]
    assert len(digests) == 2 and digests[0] == digests[1], f"the ranks' weights differ: {digests}"
    before, after = _state(llama), _state(result.export_dir)
    assert all(torch.isfinite(v).all() for v in after.values())
    moved = [k for k in before if k in after and not torch.equal(before[k], after[k].to(before[k].dtype))]
    assert moved, "the policy's weights moved"
    print(f"[dp-matrix] {name}: {rounds} rounds in {seconds:.1f} s ({len(moved)} tensors moved)")


def test_a_stuck_rank_ends_the_run_within_the_collective_timeout(ray_cluster, llama, prompts_csv, tmp_path):
    """A user's policy loss that stops on rank 1 (a planted hang): rank 0 waits in its backward pass, and the run
    ends within collective_timeout_s with an error naming the rank, the phase and rank 1's last phase."""
    from coati_relay import launch_distributed, register_algorithm
    from coati_relay.algorithms.losses import policy_loss
    from coati_relay.observe.run_result import RunFailed

    @register_algorithm("policy_loss", "stuck_on_rank_1")
    def stuck_on_rank_1(*args, **kwargs):
        import torch.distributed as dist

        if dist.get_rank() == 1:
            time.sleep(600)
        return policy_loss(*args, **kwargs)

    kw = _kwargs(llama, prompts_csv, tmp_path / "stuck", "GRPO", 4, "function", 1, 1, 0, rounds=2,
                 collective_timeout_s=10)
    kw["grpo_config"]["policy_loss"] = "stuck_on_rank_1"
    started = time.monotonic()
    with pytest.raises(RunFailed) as failed:
        launch_distributed(**kw)
    waited = time.monotonic() - started
    message = str(failed.value)
    assert "CollectiveTimeout" in message and "consumer rank 0 of 2: a collective in phase 'backward'" in message
    assert "rank 1 was last in phase 'backward' of round 0 step 0" in message
    assert waited < 120, f"the run took {waited:.0f} s to end"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "migrated"
# The migrated form of each legacy example that has trainers to count, with two of them (custom_trainer.py has one).
MIGRATED = {
    "ppo_many_roles.py": ["--num_makers", "2", "--num_trainers", "2", "--model", "llama", "--critic_model", "llama",
                          "--experience_batch_size", "4", "--train_batch_size", "2", "--update_steps", "2",
                          "--prompt_tokens", "16", "--max_length", "32"],
    "dummy_throughput.py": ["--num_makers", "2", "--num_trainers", "2", "--model", "llama", "--experience_batch_size",
                            "4", "--train_batch_size", "2", "--prompt_tokens", "16", "--max_length", "32"],
    "four_role_ppo.py": ["--workers_per_role", "2", "--batch_size", "2", "--prompt_tokens", "16", "--new_tokens", "8",
                         "--steps", "2"],
}


def _migrated_kwargs(script: str, argv, llama: str, prompts: str, run_dir: Path) -> dict:
    """The keywords the migrated script's main() passes to launch_distributed for ``argv`` (its own code)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"migrated_{script[:-3]}", EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = {"ppo_many_roles.py": ["--pretrain", llama, "--critic_pretrain", llama, "--prompt_path", prompts],
             "dummy_throughput.py": ["--pretrain", llama, "--reward_model_path", llama, "--prompt_path", prompts],
             "four_role_ppo.py": ["--pretrain", llama, "--prompt_csv", prompts]}[script]
    args = module.build_parser().parse_args([*argv, *paths, "--inference_backend", "transformers",
                                             "--run_dir", str(run_dir)])
    return module.launch_kwargs(args)


@pytest.mark.parametrize("script", sorted(MIGRATED))
def test_migrated_examples_train_on_two_consumers(ray_cluster, llama, prompts_csv, tmp_path, script):
    from coati_relay import launch_distributed

    kw = _migrated_kwargs(script, MIGRATED[script], llama, prompts_csv, tmp_path / "run")
    assert kw["num_consumer_procs"] == 2
    per_round = kw["inference_batch_size"] * kw["num_producers"]
    kw["train_dataset_config"] = {**kw["train_dataset_config"], "path": _first(prompts_csv, 2 * per_round,
                                                                               tmp_path / "two-rounds")}
    kw.update(num_episodes=1, progress=False, save_dir=str(tmp_path / "ckpt"))
    started = time.monotonic()
    result = launch_distributed(**kw)
    seconds = time.monotonic() - started
    assert [h["step"] for h in result.history] == [1, 2]
    digests = [s["weights_digest"] for s in result.consumer_stats]
    assert len(digests) == 2 and digests[0] == digests[1], f"the ranks' weights differ: {digests}"
    before, after = _state(llama), _state(result.export_dir)
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k].to(before[k].dtype)) for k in before if k in after)
    print(f"[dp-matrix] migrated {script}: 2 rounds in {seconds:.1f} s")
