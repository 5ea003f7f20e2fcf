"""``--target colossalchat``: turns the `Plan` for this engine into a call that ColossalChat's own
``launch_distributed`` (``coati.distributed.launch`` at ColossalAI 4f9953be3) accepts and reads the same way.

ColossalChat trains only the critic-free GRPO family, scores with rule-based rewards against each prompt's
``gt_answer``, reads prompts as chat JSONL with a system prompt, hands ``generate_config`` whole to the inference
backend and ``plugin_config`` whole to ``HybridParallelPlugin``. So the engine's plan is rewritten key by key: the
critic, the reward model, ``run_dir`` and ``report_to`` go, PPO becomes ``--algo`` (GRPO by default), the prompt CSV
becomes JSONL beside it, and every setting without a counterpart there becomes a NOTE.
"""
from __future__ import annotations

import ast
import re
from typing import Callable, Dict, List, Optional

from coati_compat.migrate import emitted_colossalchat
from coati_compat.migrate.analyze import LegacyScript
from coati_compat.migrate.builder import Plan
from coati_compat.migrate.expressions import args_refs
from coati_compat.migrate.notes import Note

ALGOS = ("GRPO", "DAPO", "RLOO", "REINFORCE_PPB")
REWARD_TYPES = ("think_answer_tags", "boxed")
# launch_distributed's keywords in ColossalChat's order (4f9953be3, coati/distributed/launch.py).
KWARG_ORDER = ("num_producers", "num_proc_per_producer", "num_consumer_procs", "num_episodes", "inference_batch_size",
               "inference_microbatch_size", "train_batch_size", "train_minibatch_size", "train_dataset_config",
               "inference_model_config", "generate_config", "train_model_config", "grpo_config", "plugin_config",
               "tokenizer_config", "inference_backend", "num_generations", "master_addr", "master_port",
               "core_algo", "project_name", "save_interval", "save_dir", "n_behind")
ENGINE_ONLY = ("critic_model_config", "reward_model_config", "run_dir", "report_to", "seed", "timeout_s")
# Notes of the engine's plan that the ColossalChat target replaces with its own.
REPLACED_TOPICS = {"kl-and-advantages", "trainer-strategy", "lora", "dataset", "trackers",
                   "train-epochs", "unused-flags", "callbacks", "seed-and-save-dir"}
REPLACED_PREFIXES = ("train_batch_size counts prompts", "top_k/top_p: the producers", "no checkpoint path was found "
                     "for the reward model", "no critic checkpoint was found")
TEXT_FIXES = {
    "(a GPU each where the cluster has enough, CPU shares otherwise)":
        "(ColossalChat: num_proc_per_producer GPUs per producer and one per consumer; coati-relay: CPU shares "
        "where the cluster has no GPUs)",
    " The reward model loads as a sequence classifier with one label, the critic as the checkpoint's trunk plus a "
    "value head.": "",
    "(grpo_config lr and critic_lr)": "(grpo_config['lr']; there is no critic)",
    "ray.init(...) is not needed: launch_distributed starts Ray when it is not running, and":
        "ray.init(...) moves into main(), for ColossalChat (coati-relay's launch_distributed starts Ray itself), and",
    "learning rate of actor and critic": "learning rate of the policy",
    "the call below uses core_algo='PPO' as the closest stand-in": "the call below uses core_algo=--algo (GRPO by "
                                                                    "default) as the closest stand-in",
    "each holding all four models": "each holding the policy and the reference model (rewards are rule-based)",
}

PPO_TO_GRPO = ("PPO becomes core_algo=--algo (GRPO by default): ColossalChat's launch_distributed trains only the "
               "critic-free GRPO family (--algo: GRPO, DAPO, RLOO, REINFORCE_PPB). There is no critic and no value "
               "loss: every prompt gets num_generations responses, and each response's advantage is its reward "
               "normalised within its prompt's group (GRPO and DAPO: (r - mean) / std; RLOO: r minus the mean of the "
               "others; REINFORCE_PPB: r - mean with the KL folded in, whitened over the batch). The KL to the "
               "reference model is a loss term (grpo_config['beta'] = the legacy kl_coef) instead of a reward penalty."
               " Legacy settings without a counterpart there: {missing}.")


def _dict_items(code: str) -> Dict[str, str]:
    """The items of a dict display's source, values as source (``{"a": args.x}`` -> ``{"a": "args.x"}``)."""
    node = ast.parse(code, mode="eval").body
    if not isinstance(node, ast.Dict):
        return {}
    return {ast.literal_eval(k): ast.unparse(v) for k, v in zip(node.keys, node.values) if k is not None}


def _legacy_name(text: str) -> str:
    """The legacy name a callbacks NOTE is about (``debug: ...`` -> ``debug``)."""
    match = re.match(r"the callback class (\w+)", text)
    return match.group(1) if match else text.split(":")[0].split("=")[0]


def _dest(flag_code: str) -> str:
    """The dest of an ``add_argument`` call's source (``parser.add_argument("--lr", ...)`` -> ``lr``)."""
    call = ast.parse(flag_code, mode="eval").body
    dest = next((k.value.value for k in call.keywords if k.arg == "dest"), None)
    names = [a.value for a in call.args]
    longs = [n for n in names if n.startswith("--")]
    return dest or (longs or names)[0].lstrip("-").replace("-", "_")


def _optional(flag_code: str) -> str:
    """The ``add_argument`` call's source without ``required=True``."""
    call = ast.parse(flag_code, mode="eval").body
    call.keywords = [k for k in call.keywords if k.arg != "required"]
    return ast.unparse(call)


def _call(name: str, *args: str, **kwargs: Optional[str]) -> str:
    parts = list(args) + [f"{k}={v}" for k, v in kwargs.items() if v is not None]
    return f"{name}({', '.join(parts)})"


class _Retarget:
    """One pass over an engine `Plan`; see `to_colossalchat`."""

    def __init__(self, plan: Plan, script: LegacyScript):
        self.plan, self.script = plan, script
        self.kw = dict(plan.kwargs)
        self.missing: List[str] = []

    def flag(self, dest: str, spec: str) -> str:
        if dest in self.script.flags:
            dest = f"relay_{dest}"
        self.plan.new_flags.append(f'parser.add_argument("--{dest}", {spec})')
        return f"args.{dest}"

    def note(self, topic: str, text: str, key: Optional[str] = None) -> None:
        self.plan.notes.append(Note(topic, text, key))

    def helper(self, name: str) -> str:
        if name not in self.plan.helpers:
            self.plan.helpers.append(name)
        return name

    def run(self) -> Plan:
        p = self.plan
        kept = [n for n in p.notes if n.topic not in REPLACED_TOPICS and n.key not in ENGINE_ONLY
                and not n.text.startswith(REPLACED_PREFIXES)]
        dropped_callbacks = [_legacy_name(n.text) for n in p.notes if n.topic == "callbacks"]
        p.notes = [Note(n.topic, self._fix(n.text), n.key, n.line) for n in kept]
        p.untranslated = [self._fix(t) for t in p.untranslated]
        self.algo = self.flag("algo", f'default="GRPO", choices={list(ALGOS)!r}, help="ColossalChat\'s core_algo '
                                      f'(the advantage estimator of the GRPO family)"')
        self._models()
        self._run_length()
        self._dataset()
        self._generation()
        self._algorithm()
        self._plugin()
        self._outputs(dropped_callbacks)
        p.notes.insert(0, Note("ppo-to-grpo", PPO_TO_GRPO.format(missing="; ".join(self.missing) or "none")))
        p.kwargs = {k: self.kw[k] for k in KWARG_ORDER if k in self.kw}
        p.target = "colossalchat"
        self._drop_unused_flags()
        return p

    @staticmethod
    def _fix(text: str) -> str:
        for old, new in TEXT_FIXES.items():
            text = text.replace(old, new)
        return text

    def _drop_prelude(self, keep: Callable[[str], bool]) -> None:
        """Drops prelude lines ``keep`` refuses, then ``if ...:`` lines left without a body."""
        lines = [line for line in self.plan.prelude if keep(line)]
        self.plan.prelude = [line for i, line in enumerate(lines) if not line.startswith("if ")
                             or lines[i + 1:i + 2] and lines[i + 1].startswith(" ")]

    # -- sections ------------------------------------------------------------------------------------------------
    def _models(self) -> None:
        p, s = self.plan, self.script
        critic, reward = self.kw.pop("critic_model_config", None), self.kw.pop("reward_model_config", None)
        critic_path = _dict_items(critic).get("path") if critic else None
        self.missing.append("the critic" + (f" ({critic_path})" if critic_path else "") + ", its learning rate "
                            "(critic_lr) and value_clip")
        reward_path = _dict_items(reward).get("path") if reward else None
        reward_path = reward_path if reward_path and "args." in reward_path else None
        self.missing.append("the reward model" + (f" ({reward_path})" if reward_path else ""))
        if "legacy_reward_model" in p.helpers:
            p.helpers.remove("legacy_reward_model")
        self._drop_prelude(lambda line: "reward_model_path" not in line)
        if "lora_config" in p.helpers:
            p.helpers.remove("lora_config")
            config = _dict_items(self.kw["train_model_config"])
            if "lora" in config:
                self.kw["train_model_config"] = "{" + ", ".join(f'"{k}": {v}' for k, v in config.items()
                                                                if k != "lora") + "}"
            lora_lines = ("lora = ", "if lora:", '    train_model_config["lora"]')
            self._drop_prelude(lambda line: not line.startswith(lora_lines))
            rank = next((f.dest for f in s.flags.values() if f.dest == "lora_rank"), None)
            self.missing.append("LoRA" + (" (--lora_rank)" if rank else ""))
            self.note("lora", "LoRA has no counterpart in ColossalChat's launch_distributed (train_model_config "
                              "goes to from_pretrained as it is): the policy trains fully.", key="train_model_config")
        self.note("rewards", "DECIDE: the reward. The legacy reward model has no counterpart: ColossalChat scores "
                             "every response with a rule-based verifier against its prompt's gt_answer "
                             "(grpo_config['reward_fn_type'] = --reward_type: 'think_answer_tags', the default, "
                             "or 'boxed'). The prompt CSV needs an answer column (--answer_column), and the system "
                             "prompt (--system_prompt; by default one per reward type) asks for the answer format "
                             "the verifier checks.", key="grpo_config")

    def _run_length(self) -> None:
        """A step count read from the prompt file (`coati_relay.migration.from_legacy.episodes_for_rounds`) becomes
        ``--num_episodes`` (default 1): the script must run on ColossalChat without coati-relay."""
        p = self.plan
        if "episodes_for_rounds" not in p.helpers:
            return
        p.helpers.remove("episodes_for_rounds")
        start = next(i for i, line in enumerate(p.prelude) if line.startswith("num_episodes = "))
        del p.prelude[start:start + 2]
        p.notes = [n for n in p.notes if not (n.topic == "run-length" and n.key == "num_episodes")]
        p.new_flags = [re.sub(r'help="[^"]*"', 'help="passes over the prompt file"', f) if '"--num_episodes"' in f
                       else f for f in p.new_flags]
        self.kw["num_episodes"] = "args.num_episodes or 1"
        self.note("run-length", "the legacy step count has no counterpart in ColossalChat's launch_distributed: "
                                "the run is num_episodes (default 1) passes over the prompt file, prompts // "
                                "(inference_batch_size*num_producers) rounds each.", key="num_episodes")

    def _dataset(self) -> None:
        old = _dict_items(self.kw["train_dataset_config"])
        self.reward_type = self.flag("reward_type", f'default="think_answer_tags", choices={list(REWARD_TYPES)!r}, '
                                                    f'help="grpo_config reward_fn_type: how responses are scored"')
        self.answer = self.flag("answer_column", 'default="gt_answer", help="the prompt CSV\'s column of answers"')
        system = self.flag("system_prompt", 'default=None, help="default: one that asks for --reward_type\'s format"')
        self.prompt_source = old["path"]
        self.kw["train_dataset_config"] = (f'{{"path": {self.helper("prompts_jsonl_path")}({old["path"]}), '
                                           f'"max_length": {old["max_length"]}, "system_prompt": '
                                           f'{self.helper("system_prompt")}({self.reward_type}, {system})}}')
        self.helper("write_prompts_jsonl")
        self.note("dataset", "ColossalChat reads prompts as chat JSONL ({\"messages\": {\"role\": \"user\", "
                             "\"content\": ...}, \"gt_answer\": ...}) with a system prompt, through the tokenizer's "
                             "chat template, and pads or cuts them to max_length (keeping the first tokens). main() "
                             "writes the legacy CSV's prompt and answer columns as <name>.colossalchat.jsonl beside "
                             "it (write_prompts_jsonl); a .jsonl is read as it is. The legacy collate read the raw "
                             "text, without a template.", key="train_dataset_config")

    def _generation(self) -> None:
        gen = _dict_items(self.kw["generate_config"])
        self.plan.prelude.append(f"response_tokens = {gen.get('max_new_tokens', '64')}")
        self.backend = self.kw["inference_backend"]
        self.kw["generate_config"] = _call(self.helper("colossalchat_generate_config"), self.backend,
                                           "response_tokens", temperature=gen.get("temperature"),
                                           top_k=gen.get("top_k"), top_p=gen.get("top_p"))
        self.note("generation", "ColossalChat hands generate_config whole to the backend: "
                                "vllm.SamplingParams (max_tokens, top_k -1 for no cut) or transformers' generate "
                                "(max_new_tokens, do_sample, top_k 0 for no cut), and reads temperature and top_p "
                                "itself; colossalchat_generate_config writes the keys of --inference_backend. "
                                "ColossalChat 4f9953be3 also builds vLLM SamplingParams from this config in every "
                                "producer, so run it there with --inference_backend vllm.", key="generate_config")

    def _algorithm(self) -> None:
        grpo = _dict_items(self.kw["grpo_config"])
        if "ppo_epochs" in grpo:
            self.missing.append("train_epochs (ppo_epochs: ColossalChat makes one pass over a round)")
        clip = grpo.get("clip_eps_low")
        self.kw["grpo_config"] = _call(self.helper("colossalchat_grpo_config"), self.algo, grpo["lr"],
                                       grpo.get("kl_coef", "0.1"), self.reward_type, "response_tokens",
                                       clip_eps=clip)
        self.kw["core_algo"] = self.algo
        self.kw["num_generations"] = self.flag("num_generations", 'type=int, default=8, help="responses per prompt '
                                                                  '(the group whose rewards are normalised)"')
        self.note("batch-sizes", "train_batch_size, train_minibatch_size and the inference batch sizes count "
                                 "prompts, each with num_generations responses (default 8): a step trains on "
                                 "num_generations times the legacy samples. A round (one weight version) is "
                                 "inference_batch_size*num_producers prompts, sized as for the legacy push "
                                 "interval; lower --train_batch_size to keep the samples per step.",
                  key="inference_batch_size")

    def _plugin(self) -> None:
        code = self.kw["plugin_config"]
        if "legacy_plugin_config" in self.plan.helpers:
            self.plan.helpers.remove("legacy_plugin_config")
        if code.startswith("legacy_plugin_config("):
            self.kw["plugin_config"] = self.helper("legacy_hybrid_config") + code[len("legacy_plugin_config"):]
        else:
            self.kw["plugin_config"] = repr(emitted_colossalchat.hybrid_config(ast.literal_eval(code)))
        self.note("trainer-strategy", "ColossalChat's consumers always train with HybridParallelPlugin, plugin_config "
                                      "its keywords: ddp -> ZeRO stage 0 in fp32; colossalai_zero2 -> zero_stage 2 "
                                      "with the legacy fp16 and loss scale; colossalai_gemini has no counterpart "
                                      "there and becomes zero_stage 2 too; the _cpu variants set cpu_offload. "
                                      "zero_stage > 0 needs CUDA.", key="plugin_config")

    def _outputs(self, dropped_callbacks: List[str]) -> None:
        for key in ("run_dir", "report_to"):
            self.kw.pop(key, None)
        if "save_dir" in self.script.flags:
            self.kw["save_dir"] = 'args.save_dir if args.save_dir is not None else "./model"'
            self.note("run-length", "--save_dir -> save_dir: ColossalChat saves the policy every save_interval "
                                    "(100) steps and at each episode's end; without --save_dir, in ./model.",
                      key="save_dir")
        self.note("trackers", "ColossalChat logs every step to the W&B project project_name (always; set "
                              "WANDB_MODE=offline without a login) and writes rollouts under ./rollout; coati-relay "
                              "writes run_dir/metrics.jsonl and returns a RunResult.", key="project_name")
        if dropped_callbacks:
            self.note("callbacks", f"{', '.join(dict.fromkeys(dropped_callbacks))}: no hooks in ColossalChat's "
                                   f"launch_distributed; its metrics go to W&B (coati-relay also returns them in "
                                   f"RunResult.history).")

    def _drop_unused_flags(self) -> None:
        p = self.plan
        used = set()
        for code in list(p.kwargs.values()) + p.prelude + [self.prompt_source, self.answer]:
            used |= args_refs(code)
        p.new_flags = [self._fix(f) for f in p.new_flags if f.split('"')[1][2:] in used]
        unused = [d for d in self.script.flags if d not in used]
        p.notes = [n for n in p.notes if not any(n.text.startswith(f"--{d} defaults to None") for d in unused)]
        p.legacy_flags = [_optional(f) if _dest(f) in unused else f for f in p.legacy_flags]
        if unused:
            self.note("unused-flags", f"{', '.join('--' + d for d in unused)} are still accepted (and no longer "
                                      f"required), so legacy command lines keep working, but have no effect: what "
                                      f"they set has no counterpart (see the other NOTEs).")
        p.main_prelude = [f"write_prompts_jsonl({self.prompt_source}, {self.answer})"]


def to_colossalchat(plan: Plan, script: LegacyScript) -> Plan:
    """The engine's `Plan` for ``script``, rewritten for ColossalChat's ``launch_distributed`` (in place)."""
    return _Retarget(plan, script).run()
