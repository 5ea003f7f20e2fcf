"""Four-role scripts: PPO written by hand with Ray actor classes of its own for the policy, the critic, the
reference (initial) model and the reward model (the shape of ColossalChat's community ``train_prompts_on_ray.py``
and of ``examples/legacy/four_role_ppo.py``), with ``coati.models.loss.PolicyLoss`` and no legacy ``coati.ray``
actors.

Such a script has no maker/trainer calls to read, so the mapping reads its flags by their usual names and its
loss, optimizer and generation settings by the calls that make them, and writes the closest
``launch_distributed(core_algo="PPO", ...)`` call: one producer, the policy group's ranks as consumers, a critic
and a reward model from the script's checkpoints. What the engine does differently, and what the user must
choose, is in the NOTEs (topic ``four-role``).
"""
from __future__ import annotations

import ast
from typing import Any, Dict, List, Optional

from coati_compat.migrate.analyze import LegacyScript
from coati_compat.migrate.builder import Plan
from coati_compat.migrate.expressions import call_name, keyword_map, literal
from coati_compat.migrate.mapping import _Mapper
from coati_compat.migrate.training_mapping import TRUNCATED_SAMPLING_NOTE

OPTIMIZERS = ("Adam", "AdamW", "HybridAdam", "CPUAdam")


def is_four_role(tree: ast.Module) -> bool:
    """True when the script defines ``@ray.remote`` classes and imports ``PolicyLoss`` from ``coati.models.loss``."""
    imports_policy_loss = any(isinstance(n, ast.ImportFrom) and n.module == "coati.models.loss"
                              and any(a.name == "PolicyLoss" for a in n.names) for n in ast.walk(tree))
    return imports_policy_loss and bool(remote_classes(tree))


def remote_classes(tree: ast.Module) -> List[ast.ClassDef]:
    """The classes decorated with ``ray.remote`` or ``ray.remote(...)``."""
    def is_remote(d: ast.expr) -> bool:
        target = d.func if isinstance(d, ast.Call) else d
        return isinstance(target, ast.Attribute) and target.attr == "remote"

    return [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and any(is_remote(d) for d in n.decorator_list)]


def _parameter_default(tree: ast.Module, name: str) -> Optional[Any]:
    """The literal default of a function parameter called ``name`` (``def set_loss_function(self, eps_clip=0.2)``)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = node.args.args[len(node.args.args) - len(node.args.defaults):]
            for param, default in zip(params, node.args.defaults):
                ok, value = literal(default)
                if param.arg == name and ok and value is not None:
                    return value
    return None


def _dict_with(tree: ast.Module, key: str) -> Dict[str, Any]:
    """The literal entries of the first dict display holding ``key`` (``{"max_length": 128, "top_k": 50}``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            entries = {literal(k)[1]: v for k, v in zip(node.keys, node.values) if k is not None}
            if key in entries:
                return {k: literal(v)[1] for k, v in entries.items() if isinstance(k, str) and literal(v)[0]}
    return {}


class FourRoleMapper(_Mapper):
    def build(self) -> Plan:
        s = self.script
        self._legacy_flags()
        self._roles4()
        if s.prompt_path is None:  # read inside an actor method: take the flag that names the file
            s.prompt_path = self._flag_node("prompt_csv_url", "prompt_csv", "prompt_path", "prompts")
        if s.prompt_tokens is None:
            s.prompt_tokens = self._flag_node("prompt_tokens", "max_prompt_length", "prompt_length")
        self._dataset()
        self._sizes4()
        self._models4()
        self._generation4()
        self._algorithm4()
        self._plugin4()
        self._run_length4()
        self._unused_flags()
        return self.plan

    def _flag(self, *names: str) -> Optional[str]:
        for name in names:
            if name in self.script.flags:
                return f"args.{name}"
        return None

    def _flag_node(self, *names: str) -> Optional[ast.expr]:
        code = self._flag(*names)
        return None if code is None else ast.parse(code, mode="eval").body

    def _roles4(self) -> None:
        s, p = self.script, self.plan
        classes = [c.name for c in remote_classes(s.tree)]
        if "num_actor_nodes" in s.flags and "num_gpus_per_node" in s.flags:
            ranks = "args.num_actor_nodes * args.num_gpus_per_node"
        else:
            ranks = self._flag("workers_per_role", "num_workers", "world_size") or "1"
            if ranks == "1":
                self.note("unread", "the policy group's number of ranks was not found (--num_actor_nodes with "
                                    "--num_gpus_per_node, or --workers_per_role); using one consumer.",
                          key="num_consumer_procs")
        p.prelude += ["num_producers = 1", f"num_consumers = {ranks}"]
        p.kwargs.update(num_producers="num_producers", num_proc_per_producer="1",
                        num_consumer_procs="num_consumers")
        self.untranslated(f"the script's Ray actors ({', '.join(classes)}) and hand-written PPO "
                          f"loop: the engine's roles replace them.")
        self.note("four-role", "the four groups become one producer and num_consumers consumers (one per policy "
                               "rank), each holding all four models: the other groups' sizes have no counterpart.",
                  key="num_consumer_procs")
        self.note("placement", "@ray.remote(num_gpus=...) classes and placement groups: launch_distributed places "
                               "its actors itself; `coati-relay legacy-run SCRIPT ...` runs the legacy script on CPUs.")

    def _sizes4(self) -> None:
        p = self.plan
        ebs = self._flag("experience_batch_size", "batch_size")
        if ebs is None:
            ebs = "8"
            self.note("unread", "the per-rank sampling batch (--experience_batch_size or --batch_size) was not "
                                "found; using 8 prompts.", key="inference_batch_size")
        rounds = self._flag("update_timesteps", "update_steps") or "1"
        p.prelude.append(f"inference_batch_size, inference_microbatch_size = {self.helper('round_sizes')}("
                         f"num_producers, num_consumers, {ebs}, {ebs}, {rounds})")
        p.kwargs.update(inference_batch_size="inference_batch_size",
                        inference_microbatch_size="inference_microbatch_size", train_batch_size=ebs,
                        train_minibatch_size=ebs)
        self.note("batch-sizes", f"each policy rank took an optimizer step per batch of {ebs} prompts, {rounds} "
                                 f"batch(es) per learning stage: a round holds as many per consumer.",
                  key="inference_batch_size")

    def _models4(self) -> None:
        p = self.plan
        pretrain = self._flag("pretrain", "model_path")
        if pretrain is None:
            pretrain = self.new_flag("pretrain", 'required=True, help="policy checkpoint (also the tokenizer)"')
            self.note("unread", "no --pretrain flag was found; pass the checkpoint with --pretrain.",
                      key="train_model_config")
        reward = self._flag("reward_pretrain", "reward_model_path", "rm_pretrain")
        reward = f"{reward} or {pretrain}" if reward else pretrain
        p.kwargs["inference_model_config"] = f'{{"path": {pretrain}}}'
        p.kwargs["critic_model_config"] = f'{{"path": {pretrain}}}'
        trained = self._flag("rm_path", "rm_checkpoint")
        if trained:
            p.kwargs["reward_model_config"] = f'{{"path": {self.helper("legacy_reward_model")}({reward}, {trained})}}'
        else:
            p.kwargs["reward_model_config"] = f'{{"path": {reward}}}'
        if "lora_rank" in self.script.flags:
            family = self._flag("model") or "None"
            p.kwargs["train_model_config"] = (f'{{"path": {pretrain}, '
                                              f'"lora": {self.helper("lora_config")}(args.lora_rank, {family})}}')
            self.note("lora", "lora_rank -> train_model_config['lora'] (peft, alpha=1: the legacy 1/r scaling): "
                              "only the adapters train and are published; the critic trains fully.",
                      key="train_model_config")
        else:
            p.kwargs["train_model_config"] = f'{{"path": {pretrain}}}'
        if "model" in self.script.flags:
            self.note("models", "--model: the checkpoint's config.json sets the architecture.",
                      key="train_model_config")
        if trained:
            self.note("four-role", f"{trained} (a legacy RewardModel's state dict on {reward}) becomes a one-label "
                                   f"sequence classifier (legacy_reward_model) scoring the last real token, where the "
                                   f"legacy one averaged the positions; without it each side has a random head.",
                      key="reward_model_config")
        else:
            self.note("four-role", f"DECIDE: the reward model. The legacy reward group built the critic class on "
                                   f"{reward} and scored with its value head; the engine loads "
                                   f"reward_model_config['path'] as a sequence classifier with one label, so point it "
                                   f"at a trained reward-model checkpoint, or drop reward_model_config and set "
                                   f"grpo_config['reward_fn_type'] (a registered reward name or a function of the "
                                   f"responses).", key="reward_model_config")

    def _generation4(self) -> None:
        s, p = self.script, self.plan
        gen = _dict_with(s.tree, "max_length")
        new_tokens = self._flag("new_tokens", "max_new_tokens")
        if new_tokens is None and "max_length" in gen:
            new_tokens = f"{self.helper('max_new_tokens')}({gen['max_length']}, prompt_tokens)"
            self.note("generation", f"max_length={gen['max_length']} counted prompt and response together; "
                                    f"max_new_tokens counts the response only.", key="generate_config")
        if new_tokens is None:
            new_tokens = "64"
            self.note("unread", "no response length (--new_tokens, or a generate dict with max_length) was found; "
                                "using 64 new tokens.", key="generate_config")
        config = {"max_new_tokens": new_tokens}
        config.update({k: repr(gen[k]) for k in ("temperature", "top_k", "top_p") if k in gen})
        if "top_k" in config or "top_p" in config:
            self.note("generation", TRUNCATED_SAMPLING_NOTE, key="generate_config")
        p.kwargs["generate_config"] = "{" + ", ".join(f'"{k}": {v}' for k, v in config.items()) + "}"

    def _optimizer_lr(self) -> Optional[str]:
        for node in ast.walk(self.script.tree):
            if call_name(node) in OPTIMIZERS:
                lr = keyword_map(node).get("lr")
                ok, value = literal(lr)
                if ok and value is not None:
                    return repr(value)
                if isinstance(lr, ast.Attribute) and lr.attr in self.script.flags:
                    return f"args.{lr.attr}"
        return self._flag("lr")

    def _algorithm4(self) -> None:
        s, p = self.script, self.plan
        lr = self._optimizer_lr()
        if lr is None:
            from coati_relay.parts import ALGORITHM_KEYS  # loads the engine's config: only where it is needed

            lr = repr(ALGORITHM_KEYS["lr"].default)
            self.note("unread", f"the optimizers' learning rate was not found; using the engine default {lr}.",
                      key="grpo_config")
        kl = self._flag("kl_coef") or repr(_parameter_default(s.tree, "kl_coef") or 0.1)
        clip = self._flag("clip_eps", "eps_clip") or repr(_parameter_default(s.tree, "eps_clip") or 0.2)
        value_clip = self._flag("value_clip") or repr(_parameter_default(s.tree, "value_clip") or 0.4)
        p.kwargs["grpo_config"] = (f'{{"lr": {lr}, "critic_lr": {lr}, "kl_coef": {kl}, "clip_eps_low": {clip}, '
                                   f'"clip_eps_high": {clip}, "value_clip": {value_clip}}}')
        self.note("kl-and-advantages", "compute_reward's sequence-level KL penalty and advantage = reward - value "
                                       "become -kl_coef*KL on every response token and GAE (gamma, lam in "
                                       "grpo_config).", key="grpo_config")
        p.kwargs["core_algo"] = '"PPO"'
        p.kwargs["num_generations"] = "1"

    def _plugin4(self) -> None:
        strategy = self._flag("strategy", "trainer_strategy")
        if strategy is None:
            self.plan.kwargs["plugin_config"] = '{"plugin": "ddp"}'
            return
        self.plan.kwargs["plugin_config"] = f"{self.helper('legacy_plugin_config')}({strategy})"
        self.note("trainer-strategy", "ddp, colossalai_zero2 and colossalai_gemini -> the plugins 'ddp', 'zero2' and "
                                      "'gemini' (fp16 as before); the last two need CUDA.", key="plugin_config")

    def _run_length4(self) -> None:
        s, p = self.script, self.plan
        steps = self._flag("steps", "num_steps")
        if steps is not None:  # one time step = one round (weight version): the run holds that many rounds
            p.kwargs["num_episodes"] = "num_episodes"
            spec = f'type=int, default=None, help="prompt file passes (default: enough for --{steps[5:]})"'
            p.prelude += [f"num_episodes = {self.new_flag('num_episodes', spec)} or "
                          f"{self.helper('episodes_for_rounds')}(",
                          f"    {steps}, {self.code(s.prompt_path)}, inference_batch_size * num_producers)"]
            self.note("run-length", f"{steps} time steps (one weight version each, prompts drawn at random) become "
                                    f"{steps} rounds, rounded up to whole passes over the prompt file.",
                      key="num_episodes")
        else:
            steps = " * ".join(f"args.{f}" for f in ("num_episodes", "max_timesteps") if f in s.flags)
            steps = steps or "an unknown number of"
            p.kwargs["num_episodes"] = self.new_flag(
                "num_episodes", 'type=int, default=1, help="passes over the prompt file (the run length)"')
            self.note("run-length", f"the script ran {steps} time steps, each sampling a batch per policy rank "
                                    f"(prompts drawn at random); the engine's run length follows from the data: "
                                    f"num_episodes passes over the prompt file, one round per "
                                    f"inference_batch_size*num_producers prompts.", key="num_episodes")
        p.kwargs["inference_backend"] = self.new_flag(
            "inference_backend", 'default="vllm", choices=["vllm", "transformers"]')
        self.trackers()
        p.kwargs["run_dir"] = self.new_flag("run_dir", 'default=None, help="metrics and checkpoints go here"')
        saves = [n for n in ast.walk(s.tree) if call_name(n) in ("save_model", "save_checkpoint")]
        self.seed_and_save_dir("the policy's state dict (actor.pt)" if saves else "its outputs")


def build_four_role_plan(script: LegacyScript) -> Plan:
    """The `Plan` for a four-role script (see `is_four_role`)."""
    return FourRoleMapper(script).build()
