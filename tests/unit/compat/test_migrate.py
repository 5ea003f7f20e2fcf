"""The migration rewriter: legacy launch scripts -> launch_distributed scripts and YAML configs."""
from __future__ import annotations

import ast
import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from coati_compat.migrate import analyze_source, migrate_file, migrate_source
from coati_compat.migrate.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_PARTIAL, main
from coati_compat.migrate.notes import GUIDE_PAGE, TOPICS
from coati_relay.migration.from_legacy import round_sizes

ROOT = Path(__file__).resolve().parents[3]
LEGACY = ROOT / "examples" / "legacy"
EXAMPLES = ["ppo_many_roles.py", "dummy_throughput.py", "custom_trainer.py"]

ODD_SCRIPT = textwrap.dedent('''
    """No argparse, literal values, a custom DetachedTrainer, models from the family classes."""
    from functools import partial

    import ray
    from coati.models.llama import LlamaActor, LlamaCritic, LlamaRM
    from coati.ray.detached_trainer_base import DetachedTrainer
    from coati.ray.experience_maker_holder import ExperienceMakerHolder
    from coati.ray.utils import get_strategy_from_args
    from torch.utils.data import DataLoader

    MODEL = "/models/llama-tiny"
    PROMPTS = ["hello", "tell me a story", "what is two plus two", "name a color"]


    @ray.remote
    class MyTrainer(DetachedTrainer):
        def training_step(self, experience):
            return {"loss": 0.0}

        def _update_remote_makers(self, fully_update=False, **config):
            pass


    def maker_models():
        return LlamaActor(pretrained=MODEL), LlamaCritic(pretrained=MODEL), LlamaRM(pretrained="/models/rm"), \\
            LlamaActor(pretrained=MODEL)


    def trainer_models():
        return LlamaActor(pretrained=MODEL, lora_rank=8), LlamaCritic(pretrained=MODEL)


    ray.init()
    makers = []
    for i in range(3):
        makers.append(ExperienceMakerHolder.remote([f"t{i % 2}"], partial(get_strategy_from_args, "naive"),
                                                   maker_models, kl_coef=0.02, max_length=160, temperature=0.7,
                                                   top_k=20, top_p=0.9, num_beams=2))
    trainers = [MyTrainer.remote(["m0", "m1", "m2"], 4, buffer_limit=0, model_fn=trainer_models) for _ in range(2)]
    loops = [m.workingloop.remote(lambda: DataLoader(PROMPTS, batch_size=4), num_steps=10) for m in makers]
    ray.get(loops + [t.fit.remote(total_steps=12, update_steps=3, train_epochs=2) for t in trainers])
''')


@pytest.fixture(scope="module")
def migrations():
    return {name: migrate_file(LEGACY / name) for name in EXAMPLES}


def _tiles(kw):
    """The engine's size constraints (coati_relay.assembly.build.build_run_config) hold for these keywords."""
    ibs, imbs, np_ = kw["inference_batch_size"], kw["inference_microbatch_size"], kw["num_producers"]
    tbs, nc = kw["train_batch_size"], kw["num_consumer_procs"]
    return (ibs % imbs == 0 and (ibs * np_) % (tbs * nc) == 0 and (ibs * np_ // imbs) % nc == 0
            and (tbs % imbs == 0 or imbs % tbs == 0))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_becomes_a_ppo_launch_with_notes(migrations, name):
    m = migrations[name]
    tree = ast.parse(m.script)
    defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"build_parser", "launch_kwargs", "main"} <= defs
    assert "from coati_relay import launch_distributed" in m.script
    assert not re.search(r"^\s*(from|import) coati_compat", m.script, re.M), "migrated scripts need coati_relay only"
    kw = m.launch_kwargs({"prompt_path": "p.csv"})
    carried = name == "custom_trainer.py"  # its policy-gradient loss runs with RLOO advantages, no critic
    assert (kw["core_algo"], kw["num_generations"]) == (("RLOO", 2) if carried else ("PPO", 1)) and _tiles(kw)
    assert all(n.topic in TOPICS for n in m.notes) and len(m.notes) >= 8
    assert m.script.count("# NOTE:") >= len({(n.topic, n.text) for n in m.notes})
    assert max(len(line) for line in m.script.splitlines()) <= 120


def test_many_roles_maps_the_ci_configuration(migrations):
    from coati_compat.legacy.tables import plugin_config
    from coati_compat.migrate.plugin_defaults import beyond_defaults

    m = migrations["ppo_many_roles.py"]
    assert m.complete
    kw = m.launch_kwargs(["--num_makers", "2", "--num_trainers", "2", "--trainer_strategy", "colossalai_gemini",
                          "--pretrain", "/m/opt-350m", "--critic_pretrain", "/m/opt-125m", "--experience_batch_size",
                          "4", "--train_batch_size", "2", "--prompt_path", "p.csv"])
    assert (kw["num_producers"], kw["num_consumer_procs"]) == (2, 2)
    assert (kw["inference_batch_size"], kw["inference_microbatch_size"], kw["train_batch_size"]) == (4, 4, 2)
    # the one table's, without what the plugin picks by itself (placement "static" is Gemini's default)
    assert kw["plugin_config"] == beyond_defaults(plugin_config("colossalai_gemini"))
    assert kw["plugin_config"] == {"plugin": "gemini", "precision": "fp16", "initial_scale": 32, "pin_memory": True}
    assert kw["inference_model_config"] == {"path": "/m/opt-350m"} == {"path": kw["train_model_config"]["path"]}
    assert kw["critic_model_config"] == kw["reward_model_config"] == {"path": "/m/opt-125m"}
    assert kw["train_dataset_config"] == {"path": "p.csv", "max_length": 64}
    assert kw["generate_config"] == {"max_new_tokens": 256 - 64, "temperature": 1.0, "top_k": 50}
    assert kw["grpo_config"] == {"lr": 1e-7, "critic_lr": 1e-7, "kl_coef": 0.1, "ppo_epochs": 1}
    assert "lora" not in kw["train_model_config"]
    topics = {n.topic for n in m.notes}
    assert {"routing", "placement", "buffer", "learning-rate", "batch-sizes", "unused-flags"} <= topics
    buffer = next(n for n in m.notes if n.topic == "buffer")
    assert "buffer_limit=16" in buffer.text and "(`coati-relay docs buffer`)" in m.script
    unused = next(n for n in m.notes if n.topic == "unused-flags").text
    assert "--save_dir" not in unused and "--pretrain" not in unused and kw["save_dir"] is None, "--save_dir: mapped"


def test_every_strategy_choice_translates(migrations):
    """Every legacy --trainer_strategy becomes the plugin_config of the one table (coati_compat.legacy.tables),
    which keeps the legacy fp16 and loss scale of ZeRO and Gemini, written without the settings the plugin picks by
    itself; the engine accepts each."""
    from coati_compat.legacy.tables import LEGACY_STRATEGIES, plugin_config
    from coati_compat.migrate.plugin_defaults import beyond_defaults
    from coati_relay.training.plugins import resolve_plugin

    m = migrations["ppo_many_roles.py"]
    got = {name: m.launch_kwargs({"trainer_strategy": name})["plugin_config"] for name in LEGACY_STRATEGIES}
    assert got == {name: beyond_defaults(plugin_config(name)) for name in LEGACY_STRATEGIES}
    assert got["naive"] == got["ddp"] == {"plugin": "ddp"}
    zero = {"plugin": "zero2", "precision": "fp16", "initial_scale": 2 ** 16}  # the legacy fp16 and loss scale
    assert got["colossalai_zero2"] == zero
    assert got["colossalai_zero2_cpu"] == {**zero, "cpu_offload": True}
    gemini = {"plugin": "gemini", "precision": "fp16", "initial_scale": 32, "pin_memory": True}
    assert got["colossalai_gemini"] == gemini
    assert got["colossalai_gemini_cpu"] == {**gemini, "offload_param_frac": 1.0, "offload_optim_frac": 1.0}
    for config in got.values():
        options = dict(config)
        resolve_plugin(options.pop("plugin"), options, allow_cpu_fallback=True)


@pytest.mark.parametrize("name", ["colossalai_zero2", "colossalai_zero2_cpu", "colossalai_gemini",
                                  "colossalai_gemini_cpu"])
def test_a_shortened_strategy_builds_the_plugin_the_whole_one_builds(name):
    """The plugin's constructor gets the same arguments from the migrated script's short plugin_config as from every
    setting the legacy strategy picks: the left-out ones are the engine's defaults or the installed colossalai's."""
    import inspect

    from colossalai.booster.plugin import GeminiPlugin, LowLevelZeroPlugin

    from coati_compat.legacy.tables import plugin_config
    from coati_compat.migrate.plugin_defaults import COLOSSALAI_DEFAULTS, beyond_defaults
    from coati_relay.training.plugins import resolve_plugin

    classes = {"zero2": LowLevelZeroPlugin, "gemini": GeminiPlugin}
    for plugin, defaults in COLOSSALAI_DEFAULTS.items():
        parameters = inspect.signature(classes[plugin]).parameters
        assert defaults == {k: parameters[k].default for k in defaults}, plugin

    def constructor_arguments(config):
        options = dict(config)
        plugin = options.pop("plugin")
        used, resolved = resolve_plugin(plugin, options, cuda_available=True)
        bound = inspect.signature(classes[used]).bind(**resolved)
        bound.apply_defaults()
        return used, bound.arguments

    whole = plugin_config(name)
    assert len(beyond_defaults(whole)) < len(whole)
    assert constructor_arguments(beyond_defaults(whole)) == constructor_arguments(whole)


def test_lora_rank_becomes_a_peft_adapter_with_the_legacy_scaling(migrations):
    m = migrations["ppo_many_roles.py"]
    lora = m.launch_kwargs({"model": "llama", "lora_rank": 4})["train_model_config"]["lora"]
    assert lora["r"] == 4 and lora["alpha"] == 1 and {"q_proj", "down_proj", "lm_head"} <= set(lora["target_modules"])
    assert "lora" not in m.launch_kwargs({"lora_rank": 0})["train_model_config"]
    note = next(n for n in m.notes if n.topic == "lora" and "alpha=1" in n.text)
    assert "critic trains fully" in note.text


def test_random_prompt_benchmark_needs_a_prompt_file(migrations):
    m = migrations["dummy_throughput.py"]
    assert "--prompt_path" in m.script and "required=True" in m.script
    kw = m.launch_kwargs({"max_length": 272})
    assert kw["train_dataset_config"]["max_length"] == 128 and kw["generate_config"]["max_new_tokens"] == 144
    with pytest.raises(ValueError, match="no room for a response"):
        m.launch_kwargs({"max_length": 100})
    texts = " ".join(n.text for n in m.notes)
    assert "random token ids" in texts and "random weights of the shape" in texts


def test_custom_trainer_carries_its_loss_and_hook(migrations):
    """The custom training step is carried as a loss, the callback as a hook (tests/unit/compat/
    test_custom_code_migration.py has the details); the custom trainer's lr= is still its learning rate."""
    m = migrations["custom_trainer.py"]
    assert m.complete and "NOT TRANSLATED" not in m.script
    kw = m.launch_kwargs({"prompt_path": "p.csv"})
    assert kw["grpo_config"]["lr"] == 1e-5 and kw["grpo_config"]["policy_loss"] == "DetachedPGTrainer"
    assert kw["train_dataset_config"]["max_length"] == 32
    assert any(n.topic == "custom-classes" and "MetricsWriter" in n.text for n in m.notes)


def test_odd_script_without_argparse():
    m = migrate_source(ODD_SCRIPT, "odd.py")
    assert len(m.untranslated) == 1 and "MyTrainer(DetachedTrainer)" in m.untranslated[0]
    assert "The legacy script took no command-line flags" in m.script
    kw = m.launch_kwargs({"prompt_path": "x.csv"})
    assert (kw["num_producers"], kw["num_consumer_procs"]) == (3, 2)
    assert (kw["inference_batch_size"], kw["inference_microbatch_size"], kw["train_batch_size"]) == (8, 4, 4)
    assert kw["generate_config"] == {"max_new_tokens": 160 - 96, "temperature": 0.7, "top_k": 20, "top_p": 0.9}
    assert kw["grpo_config"] == {"lr": 1e-7, "critic_lr": 1e-7, "kl_coef": 0.02, "ppo_epochs": 2}
    assert kw["inference_model_config"]["path"] == kw["critic_model_config"]["path"] == "/models/llama-tiny"
    assert kw["reward_model_config"] == {"path": "/models/rm"}
    assert kw["train_model_config"]["lora"]["r"] == 8
    texts = " ".join(n.text for n in m.notes)
    assert "num_beams=2" in texts and "prompt length" in texts and "24 prompts per round" in texts


def test_values_computed_by_the_script_are_reported_not_guessed():
    source = ODD_SCRIPT.replace("kl_coef=0.02", "kl_coef=pick_kl()").replace("max_length=160",
                                                                               "max_length=len(PROMPTS) * 40")
    m = migrate_source(source, "odd.py")
    kw = m.launch_kwargs({"prompt_path": "x.csv"})
    assert kw["grpo_config"]["kl_coef"] == 0.1, "the legacy default"
    assert kw["generate_config"]["max_new_tokens"] == 4 * 40 - 96, "len() of a literal list is portable"
    assert any(n.topic == "unread" and "kl_coef" in n.text for n in m.notes)


def test_project_and_wandb_flags_become_project_name_and_report_to(migrations):
    plain = migrations["ppo_many_roles.py"]
    kw = plain.launch_kwargs({"prompt_path": "p.csv"})
    assert (kw["project_name"], kw["report_to"]) == ("ppo_many_roles", []), "metrics.jsonl only by default"
    assert plain.launch_kwargs(["--prompt_path", "p.csv", "--report_to", "tensorboard", "wandb"])["report_to"] == [
        "tensorboard", "wandb"]
    source = (LEGACY / "ppo_many_roles.py").read_text().replace(
        '    parser.add_argument("--num_makers", type=int, default=1)\n',
        '    parser.add_argument("--num_makers", type=int, default=1)\n'
        '    parser.add_argument("-p", "--project", default="GRPO")\n'
        '    parser.add_argument("--use_wandb", action="store_true")\n')
    m = migrate_source(source, "ppo_many_roles.py")
    kw = m.launch_kwargs(["--prompt_path", "p.csv", "--project", "my runs", "--use_wandb"])
    assert (kw["project_name"], kw["report_to"]) == ("my runs", ["wandb"])
    assert m.launch_kwargs({"prompt_path": "p.csv"})["report_to"] == []
    assert any(n.topic == "trackers" and "--use_wandb" in n.text for n in m.notes)


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="not valid Python"):
        analyze_source("def broken(:\n", "broken.py")
    with pytest.raises(ValueError, match="nothing to migrate"):
        analyze_source("import ray\nray.init()\n", "plain.py")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        migrate_file(tmp_path / "missing.py")
    m = migrate_source(ODD_SCRIPT, "odd.py")
    with pytest.raises(ValueError, match="no flag --nope"):
        m.launch_kwargs({"nope": 1})


@pytest.mark.parametrize("np_,nc,ebs,tbs,us", list(itertools.product((1, 2, 3), (1, 2, 4), (2, 4, 6, 8), (2, 8),
                                                                     (1, 2, 3))))
def test_round_sizes_tile_and_hold_the_legacy_push_interval(np_, nc, ebs, tbs, us):
    ibs, imbs = round_sizes(np_, nc, ebs, tbs, us)
    kw = dict(inference_batch_size=ibs, inference_microbatch_size=imbs, num_producers=np_, train_batch_size=tbs,
              num_consumer_procs=nc)
    assert _tiles(kw)
    target = us * tbs * nc
    assert ibs * np_ >= target
    smaller = [b for b in range(imbs, ibs, imbs) if b * np_ >= target and _tiles({**kw, "inference_batch_size": b})]
    assert not smaller, "the smallest round that tiles"
    if (target % np_ == 0 and (target // np_) % imbs == 0 and _tiles({**kw, "inference_batch_size": target // np_})):
        assert ibs * np_ == target, "exactly update_steps optimizer steps per round when that tiles"


def test_round_sizes_rejects_bad_sizes():
    with pytest.raises(ValueError, match="update_steps must be a positive int"):
        round_sizes(1, 1, 8, 8, 0)


def test_guide_has_an_anchor_for_every_note_topic():
    text = (ROOT / GUIDE_PAGE).read_text()
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    assert set(TOPICS) <= anchors, sorted(set(TOPICS) - anchors)


def test_cli_writes_script_and_yaml_and_reports(tmp_path, capsys):
    out, cfg = tmp_path / "new.py", tmp_path / "run.yaml"
    rc = main([str(LEGACY / "ppo_many_roles.py"), "-o", str(out), "--yaml", str(cfg), "--set", "pretrain=/m/a",
               "--set", "num_makers=2"])
    assert rc == EXIT_OK and "NOTE(s)" in capsys.readouterr().err
    compile(out.read_text(), str(out), "exec")
    config = yaml.safe_load(cfg.read_text())
    assert config["num_producers"] == 2 and config["inference_model_config"] == {"path": "/m/a"}
    assert cfg.read_text().startswith("# launch_distributed keywords") and "# NOTE:" in cfg.read_text()
    odd = tmp_path / "odd.py"
    odd.write_text(ODD_SCRIPT)
    assert main([str(odd), "-o", str(tmp_path / "odd_new.py")]) == EXIT_PARTIAL
    assert "NOT TRANSLATED" in capsys.readouterr().err
    assert main([str(odd), "-o", str(odd)]) == EXIT_BAD_INPUT and odd.read_text() == ODD_SCRIPT
    assert main([str(odd), "-o", str(tmp_path)]) == EXIT_BAD_INPUT, "a directory: the legacy script's own path"
    into = tmp_path / "migrated"
    into.mkdir()
    assert main([str(odd), "-o", str(into)]) == EXIT_PARTIAL and (into / "odd.py").read_text().startswith('"""odd')
    assert main([str(tmp_path / "missing.py")]) == EXIT_BAD_INPUT
    assert main([str(LEGACY / "ppo_many_roles.py"), "--yaml", str(cfg), "--set", "nope"]) == EXIT_BAD_INPUT


def test_generated_config_passes_engine_validation(migrations, tiny_model_path, tmp_path):
    from coati_relay.assembly.build import build_run_config
    from coati_relay.toy import write_toy_dataset

    csv = write_toy_dataset(tmp_path / "prompts.csv", num_prompts=32, fmt="csv")
    flags = {"pretrain": tiny_model_path, "critic_pretrain": tiny_model_path, "prompt_path": str(csv),
             "max_length": 112, "model": "llama"}
    for lora_rank in (0, 4):
        config = yaml.safe_load(migrations["ppo_many_roles.py"].yaml({**flags, "lora_rank": lora_rank,
                                                                       "prompt_tokens": 96}))
        cfg = build_run_config(**config)
        assert cfg.core_algo == "PPO" and cfg.data.num_prompts == 32 and cfg.optimizer_steps_per_round == 2
        assert cfg.sampling.max_new_tokens == 16 and cfg.models.reward_model_path == tiny_model_path
    assert cfg.models.lora["r"] == 4


@pytest.mark.slow
def test_migrated_script_runs_end_to_end(migrations, tiny_model_path, tmp_path):
    from coati_relay.toy import write_toy_dataset

    csv = write_toy_dataset(tmp_path / "prompts.csv", num_prompts=16, fmt="csv")
    script = tmp_path / "ppo_many_roles_relay.py"
    script.write_text(migrations["ppo_many_roles.py"].script)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_ADDRESS="local", RAY_DEDUP_LOGS="0")
    done = subprocess.run(
        [sys.executable, str(script), "--pretrain", tiny_model_path, "--critic_pretrain", tiny_model_path,
         "--prompt_path", str(csv), "--prompt_tokens", "96", "--max_length", "104", "--num_episodes", "1",
         "--lr", "1e-4",
         "--inference_backend", "transformers", "--run_dir", str(tmp_path / "run")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "'steps': 1" in done.stdout
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 1 and '"value_loss"' in metrics[0]


COMMUNITY_SHAPED = textwrap.dedent('''
    """Four groups of hand-written Ray actors, flags named as in ColossalChat's community Ray example."""
    import argparse

    import pandas as pd
    import ray
    from coati.models.loss import PolicyLoss, ValueLoss
    from colossalai.nn.optimizer import HybridAdam


    @ray.remote(num_gpus=1)
    class Policy:
        def setup(self, model, csv):
            self.prompts = pd.read_csv(csv)["prompt"]
            self.optimizer = HybridAdam(model.parameters(), lr=5e-6)
            self.generate_kwargs = {"max_length": 128, "do_sample": True, "temperature": 1.0, "top_k": 50}

        def tokenize(self, tokenizer, texts):
            return tokenizer(texts, return_tensors="pt", max_length=96, padding=True, truncation=True)

        def set_loss_function(self, eps_clip: float = 0.2):
            self.loss = PolicyLoss(eps_clip)


    @ray.remote(num_gpus=1)
    class Critic:
        def set_loss_function(self, value_clip: float = 0.4):
            self.loss = ValueLoss(value_clip)


    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt_csv_url", type=str)
    parser.add_argument("--strategy", choices=["ddp", "colossalai_gemini", "colossalai_zero2"], default="ddp")
    parser.add_argument("--pretrain", type=str, default="gpt2")
    parser.add_argument("--num_episodes", type=int, default=10)
    parser.add_argument("--max_timesteps", type=int, default=10)
    parser.add_argument("--update_timesteps", type=int, default=10)
    parser.add_argument("--experience_batch_size", type=int, default=8)
    parser.add_argument("--num_actor_nodes", type=int, default=1)
    parser.add_argument("--num_gpus_per_node", type=int, default=1)
    args = parser.parse_args()
    ray.init()
''')


def test_community_shaped_four_role_script_becomes_ppo_with_decisions():
    m = migrate_source(COMMUNITY_SHAPED, "community.py")
    kw = m.launch_kwargs({"prompt_csv_url": "p.csv", "pretrain": "/m/gpt2", "num_actor_nodes": 2,
                          "num_gpus_per_node": 2, "update_timesteps": 2, "experience_batch_size": 4})
    assert kw["core_algo"] == "PPO" and kw["num_consumer_procs"] == 4 and _tiles(kw)
    assert kw["inference_batch_size"] * kw["num_producers"] == 2 * 4 * 4, "two batches of 4 per policy rank"
    assert kw["train_batch_size"] == 4 and kw["num_episodes"] == 1
    assert kw["train_dataset_config"] == {"path": "p.csv", "max_length": 96}
    assert kw["generate_config"] == {"max_new_tokens": 32, "temperature": 1.0, "top_k": 50}
    assert kw["grpo_config"] == {"lr": 5e-06, "critic_lr": 5e-06, "kl_coef": 0.1, "clip_eps_low": 0.2,
                                 "clip_eps_high": 0.2, "value_clip": 0.4}
    assert kw["critic_model_config"] == kw["reward_model_config"] == {"path": "/m/gpt2"}
    assert kw["plugin_config"] == {"plugin": "ddp"}
    assert "DECIDE: the reward model" in m.script and "--relay_num_episodes" in m.script
    assert m.untranslated and "Policy, Critic" in m.untranslated[0]


def test_four_role_example_migration_passes_engine_validation(tiny_model_path, tmp_path):
    from coati_relay.assembly.build import build_run_config
    from coati_relay.toy import write_toy_dataset

    m = migrate_file(LEGACY / "four_role_ppo.py")
    assert m.script == (ROOT / "examples" / "migrated" / "four_role_ppo.py").read_text()
    csv = write_toy_dataset(tmp_path / "prompts.csv", num_prompts=32, fmt="csv")
    config = yaml.safe_load(m.yaml({"pretrain": tiny_model_path, "prompt_csv": str(csv), "workers_per_role": 2,
                                    "lora_rank": 4}))
    cfg = build_run_config(**config)
    assert cfg.core_algo == "PPO" and cfg.models.critic_model_path == cfg.models.reward_model_path == tiny_model_path
    assert cfg.models.lora["r"] == 4 and cfg.sampling.max_new_tokens == 16
