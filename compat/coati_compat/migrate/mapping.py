"""The mapping from what a legacy script sets up to the keywords of ``launch_distributed``: a `Plan`.

Every value is Python source for the migrated script: a literal, or an expression over ``args.<flag>`` (the
legacy command-line flags keep their names and defaults). Every legacy setting without a counterpart becomes a
`Note`; parts that need hand work (custom training steps, custom makers) also go to ``Plan.untranslated``.
"""
from __future__ import annotations

import ast
from typing import Any, Dict, List, Optional

from coati_compat.migrate import custom_mapping
from coati_compat.migrate.analyze import ActorCall, LegacyScript
from coati_compat.migrate.builder import MappingContext, Plan
from coati_compat.migrate.expressions import args_refs, evaluate, portable_flag_call, source
from coati_compat.migrate.training_mapping import map_algorithm, map_generation, map_models, map_plugin
from coati_relay.parts import from_legacy

UPSTREAM_PROMPT_TOKENS = 96


class _Mapper(MappingContext):
    # -- the mapping -----------------------------------------------------------------------------------------
    def build(self) -> Plan:
        s = self.script
        self._legacy_flags()
        maker = s.makers[0] if s.makers else None
        trainer = s.trainers[0] if s.trainers else None
        self._roles(maker, trainer)
        self._custom_classes()
        self._placement()
        sizes = self._sizes(maker, trainer)
        self._dataset()
        map_models(self, maker, trainer)
        map_generation(self, maker)
        map_algorithm(self, maker, trainer)
        map_plugin(self, maker, trainer)
        self._run_length(sizes)
        custom_mapping.finish(self)
        self._leftover_keywords(maker, trainer)
        self._unused_flags()
        return self.plan

    def _legacy_flags(self) -> None:
        for flag in self.script.flags.values():
            call, dropped = portable_flag_call(flag.call)
            self.plan.legacy_flags.append(source(call))
            if dropped:
                self.note("unread", f"--{flag.dest}: the keywords {dropped} of its add_argument call are not "
                                    f"plain values and were dropped; the flag takes strings now.", line=flag.line)

    def _count(self, sites: List[ActorCall], flag: str, what: str) -> str:
        counts = [self.code(site.count) if site.count is not None else None for site in sites]
        if sites and all(c is not None for c in counts):
            return " + ".join(counts) if len(counts) > 1 else counts[0]
        fallback = f"args.{flag}" if flag in self.script.flags else "1"
        self.note("unread", f"could not tell how many {what} actors the script creates; using {fallback}.",
                  line=sites[0].line if sites else 0)
        return fallback

    def _roles(self, maker: Optional[ActorCall], trainer: Optional[ActorCall]) -> None:
        p = self.plan
        self.np_code = self._count(self.script.makers, "num_makers", "ExperienceMakerHolder")
        self.nc_code = self._count(self.script.trainers, "num_trainers", "trainer")
        p.prelude += [f"num_producers = {self.np_code}", f"num_consumers = {self.nc_code}"]
        p.kwargs["num_producers"] = "num_producers"
        p.kwargs["num_proc_per_producer"] = "1"
        p.kwargs["num_consumer_procs"] = "num_consumers"
        if maker is None:
            self.untranslated("the script creates no ExperienceMakerHolder: the engine always runs producers; "
                              "their settings below are the legacy defaults.")
        if trainer is None:
            self.untranslated("the script creates no trainer: the engine always trains; its settings below are "
                              "the legacy defaults.")
        names = [k for k in ("detached_trainer_name_list", "experience_maker_holder_name_list")
                 if k in (maker.kwargs if maker else {}) or k in (trainer.kwargs if trainer else {})]
        if names or self.script.uses_receivers:
            extra = " and get_receivers_per_sender" if self.script.uses_receivers else ""
            self.note("routing", f"{' and '.join(names)}{extra} have no counterpart: every consumer reads one "
                                 f"shared rollout queue, so there are no actor names or routes to compute.",
                      key="num_producers")
        for role, sites in (("maker", self.script.makers), ("trainer", self.script.trainers)):
            if len({self._config_key(st) for st in sites}) > 1:
                self.note("unread", f"the script creates {role}s with different settings at lines "
                                    f"{[st.line for st in sites]}; the engine's {role.replace('maker', 'producer')}s"
                                    f" share one configuration, taken from line {sites[0].line}.")

    @staticmethod
    def _config_key(site: ActorCall) -> str:
        skip = {"env_info", "detached_trainer_name_list", "experience_maker_holder_name_list"}
        return repr(sorted((k, ast.dump(v)) for k, v in site.kwargs.items() if k not in skip))

    def _custom_classes(self) -> None:
        carried = custom_mapping.carry_classes(self)
        for c in self.script.custom_classes:
            if c.name in carried:
                continue
            if c.kind == "callback":
                self.note("callbacks", f"the callback class {c.name}({c.base}) is not translated: the engine has "
                                       f"no hooks; read the same numbers from the returned RunResult.history or "
                                       f"run_dir/metrics.jsonl.", line=c.line)
                continue
            custom = [m for m in c.methods if m != "__init__"]
            if c.kind == "trainer" and (c.base == "DetachedTrainer" or "training_step" in custom):
                self.untranslated(f"{c.name}({c.base}) defines its own training step ({', '.join(custom)}): the "
                                  f"rewriter cannot translate a custom training_step. launch_distributed trains "
                                  f"with a built-in algorithm (core_algo PPO, GRPO, DAPO, RLOO, REINFORCE_PPB); the "
                                  f"call below uses core_algo='PPO' as the closest stand-in.", c.line)
            elif custom:
                closest = ("the closest extension points are a registered reward (coati_relay.register_reward) "
                           "for how experience is scored, an advantage estimator (register_estimator) for how it "
                           "becomes advantages, and generate_config for sampling" if c.kind == "maker" else
                           "the closest extension points are a registered policy loss or value loss "
                           "(coati_relay.algorithms.register) and hooks (launch_distributed(callbacks=[...]))")
                self.untranslated(f"{c.name}({c.base}) overrides {', '.join(custom)}: custom {c.kind} behaviour "
                                  f"cannot be translated; the engine's built-in "
                                  f"{'producer' if c.kind == 'maker' else 'consumer'} replaces it; {closest} "
                                  f"(migration_guide/custom_code.md).", c.line)

    def _placement(self) -> None:
        opts = sorted({k for site in self.script.makers + self.script.trainers for k in site.options})
        if opts:
            self.note("placement", f".options({', '.join(opts)}) on the legacy actors has no counterpart: "
                                   f"launch_distributed creates and places its actors itself (a GPU each where "
                                   f"the cluster has enough, CPU shares otherwise).")
        if self.script.ray_init_line:
            self.note("placement", "ray.init(...) is not needed: launch_distributed starts Ray when it is not "
                                   "running, and no RAY_NAMESPACE is read (the engine's actors are not looked up "
                                   "by name).",
                      line=self.script.ray_init_line)
        sites = [st for st in self.script.makers + self.script.trainers if "env_info" in st.kwargs]
        if sites:
            self.note("env-info", "env_info (rank, world size, master address and port) has no counterpart: the "
                                  "engine sets up the consumers' process group itself.", line=sites[0].line)

    # -- sizes, data, run length -----------------------------------------------------------------------------
    def eval_code(self, code: str) -> Any:
        try:
            return evaluate(ast.parse(code, mode="eval").body, self.defaults)
        except Exception:  # a flag added by the migration, or a default of None
            return None

    def _sizes(self, maker: Optional[ActorCall], trainer: Optional[ActorCall]) -> Dict[str, str]:
        s, p = self.script, self.plan
        loader = self.code(s.loader_batch_size)
        if "experience_batch_size" in s.flags:
            ebs = "args.experience_batch_size"
        else:
            ebs = self.code(self.kw(maker, "experience_batch_size")) or loader
        if ebs is None:
            ebs = "8"
            self.note("unread", "the maker's batch size was not found (no --experience_batch_size, no DataLoader "
                                "batch_size); using the legacy default 8.", key="inference_batch_size")
        if loader is not None and loader != ebs:
            self.note("batch-sizes", f"the legacy data loader fed `{loader}` prompts per maker step while the "
                                     f"trainers' total_steps counted {ebs} (so most of what was generated was never "
                                     f"trained on); each producer micro-batch here is {ebs} prompts.",
                      key="inference_batch_size")
        tbs = self.code(self.kw(trainer, "train_batch_size")) or "8"
        fit = s.method_calls("fit")[0] if s.method_calls("fit") else None
        us = self.code(fit.kwargs.get("update_steps")) if fit else None
        if us is None:
            us = "1"
            self.note("unread", "fit(total_steps, update_steps, ...) was not found or its update_steps is not a "
                                "plain value; sizing rounds for one optimizer step per weight version.",
                      key="inference_batch_size", line=fit.line if fit else 0)
        p.prelude.append(f"inference_batch_size, inference_microbatch_size = {self.helper('round_sizes')}("
                         f"num_producers, num_consumers, {ebs}, {tbs}, {us})")
        p.kwargs["inference_batch_size"] = "inference_batch_size"
        p.kwargs["inference_microbatch_size"] = "inference_microbatch_size"
        p.kwargs["train_batch_size"] = tbs
        p.kwargs["train_minibatch_size"] = tbs
        sizes = {"np": self.np_code, "nc": self.nc_code, "ebs": ebs,
                 "tbs": tbs, "us": us}
        values = {k: self.eval_code(v) for k, v in sizes.items()}
        text = ("train_batch_size counts prompts; with one response per prompt (num_generations=1) that is the "
                "legacy count of samples. A round (one weight version) is inference_batch_size*num_producers "
                "prompts, sized to hold what the legacy trainers consumed between two weight pushes "
                "(update_steps*train_batch_size*num_trainers samples) and rounded up until the engine's sizes "
                "tile.")
        try:
            ibs, _ = from_legacy.round_sizes(values["np"], values["nc"], values["ebs"], values["tbs"], values["us"])
            per_round = ibs * values["np"]
            text += (f" With the legacy defaults: {ibs}*{values['np']} = {per_round} prompts per round, "
                     f"{per_round // (values['tbs'] * values['nc'])} optimizer step(s) per consumer per weight "
                     f"version (legacy: a push every {values['us']} batch(es)); the prompt file needs at least "
                     f"{per_round} prompts.")
            values["per_round"] = per_round
        except (TypeError, ValueError):
            pass
        self.note("batch-sizes", text, key="inference_batch_size")
        return {**sizes, **{f"{k}_value": v for k, v in values.items()}}

    def _dataset(self) -> None:
        s = self.script
        tokens = self.code(s.prompt_tokens)
        if tokens is None:
            tokens = str(UPSTREAM_PROMPT_TOKENS)
            self.note("unread", f"the prompt length (a tokenizer call's max_length with padding/truncation) was "
                                f"not found; using {UPSTREAM_PROMPT_TOKENS} as the upstream examples did.",
                      key="train_dataset_config")
        self.plan.prelude.append(f"prompt_tokens = {tokens}")
        path = self.code(s.prompt_path)
        if path is None:
            spec = 'required=True, help="prompt file: a .csv with a prompt column, or ColossalChat .jsonl"'
            path = self.new_flag("prompt_path", spec)
            if s.random_prompts:
                self.note("dataset", "the legacy script fed random token ids (a throughput benchmark); the engine "
                                     "reads prompts from a file: pass --prompt_path.", key="train_dataset_config")
            else:
                self.note("unread", "no prompt CSV (pd.read_csv(<path>)) with a plain path was found; pass "
                                    "--prompt_path.", key="train_dataset_config", line=s.prompt_path_line)
        else:
            self.note("dataset", "the legacy collate (in each maker) cut or padded each prompt to exactly "
                                 "prompt_tokens tokens; the engine samples the same CSV column (raw text, no chat "
                                 "template), pads per batch and keeps an over-long prompt's first prompt_tokens.",
                      key="train_dataset_config", line=s.prompt_path_line)
        self.plan.kwargs["train_dataset_config"] = f'{{"path": {path}, "max_length": prompt_tokens}}'

    def _run_length(self, sizes: Dict[str, Any]) -> None:
        s, p = self.script, self.plan
        p.kwargs["num_episodes"] = self.new_flag(
            "num_episodes", 'type=int, default=1, help="passes over the prompt file (the run length)"')
        loop = s.method_calls("workingloop")[0] if s.method_calls("workingloop") else None
        fit = s.method_calls("fit")[0] if s.method_calls("fit") else None
        parts = []
        if loop is not None:
            steps = self.code(loop.kwargs.get("num_steps"))
            parts.append(f"each maker made workingloop(num_steps={steps}) batches" if steps else
                         "each maker made num_epochs passes over its data loader")
        if fit is not None:
            total, us = self.code(fit.kwargs.get("total_steps")), sizes["us"]
            parts.append(f"each trainer trained fit(total_steps={total}, update_steps={us}) batches")
            batches = self.value(fit.kwargs.get("total_steps"))
            if isinstance(batches, int) and isinstance(sizes.get("us_value"), int) and sizes["us_value"] > 0:
                batches = batches // sizes["us_value"] * sizes["us_value"]
                samples = batches * (sizes.get("tbs_value") or 0) * (sizes.get("nc_value") or 0)
                parts.append(f"that is {batches} batches per trainer, {samples} samples in all (flags at their "
                             f"defaults)")
        text = ("; ".join(parts) + ". " if parts else "") + (
            "The engine's run length follows from the data: num_episodes * (prompts in the file // "
            "(inference_batch_size*num_producers)) rounds; set --num_episodes (and the file's size) to match.")
        self.note("run-length", text, key="num_episodes", line=fit.line if fit else 0)
        if loop is not None and "num_epochs" in loop.kwargs:
            self.note("run-length", "workingloop(num_epochs=...) has no counterpart: use num_episodes.",
                      key="num_episodes", line=loop.line)
        p.kwargs["inference_backend"] = self.new_flag(
            "inference_backend", 'default="vllm", choices=["vllm", "transformers"]')
        self.trackers()
        p.kwargs["run_dir"] = self.new_flag("run_dir", 'default=None, help="metrics and checkpoints go here"')
        saved = [m for m in ("strategy_save_actor", "strategy_save_critic") if s.method_calls(m)]
        self.seed_and_save_dir(f"{' and '.join(saved)}() files" if saved else "its outputs")

    def _leftover_keywords(self, maker: Optional[ActorCall], trainer: Optional[ActorCall]) -> None:
        seen = set()
        for site, handled in ((maker, _MAKER_HANDLED), (trainer, _TRAINER_HANDLED)):
            if site is None:
                continue
            for key, node in site.kwargs.items():
                if key in handled or (key == "callbacks" and "callbacks" in self.plan.main_kwargs):
                    continue
                topic, text = _KEYWORD_NOTES.get(key, ("generation" if site.role == "maker" else "unread", None))
                if text is None:
                    text = (f"{key}={source(node)} went into the legacy generate() keywords; the engine's "
                            f"generate_config takes max_new_tokens, temperature, top_k, top_p, seed, "
                            f"stop_token_ids and ignore_eos." if site.role == "maker" else
                            f"{site.class_name}({key}={source(node)}) has no counterpart in launch_distributed.")
                if (topic, text) not in seen:
                    seen.add((topic, text))
                    self.note(topic, text.replace("{value}", source(node)), line=site.line)
        sync = self.script.method_calls("sync_models_to_remote_makers")
        if sync:
            self.note("initial-sync", "sync_models_to_remote_makers() is not needed: producers always start from "
                                      "the weights the consumers publish first (version 0).", line=sync[0].line)

    def _unused_flags(self) -> None:
        used = set()
        p = self.plan
        for code in list(p.kwargs.values()) + list(p.main_kwargs.values()) + ["\n".join(p.prelude + p.main_prelude)]:
            used |= args_refs(code)
        unused = [f"--{d}" for d in self.script.flags if d not in used]
        if unused:
            self.note("unused-flags", f"{', '.join(unused)} are still accepted, so legacy command lines keep "
                                      f"working, but have no effect: what they set has no counterpart (see the "
                                      f"other NOTEs).")


_MAKER_HANDLED = {"model_fn", "kl_coef", "max_length", "temperature", "top_k", "top_p", "detached_trainer_name_list",
                  "env_info", "strategy_fn"}
_TRAINER_HANDLED = {"model_fn", "strategy_fn", "train_batch_size", "eps_clip", "value_clip", "lr",
                    "experience_maker_holder_name_list", "env_info"}
_KEYWORD_NOTES = {
    "sync_models_from_trainers": ("initial-sync", "sync_models_from_trainers: producers always start from the "
                                                  "weights the consumers publish first (version 0)."),
    "buffer_cpu_offload": ("buffer", "buffer_cpu_offload: rollouts always travel through Ray's object store in "
                                     "CPU memory."),
    "callbacks": ("callbacks", "callbacks: the engine has no hooks; launch_distributed returns a RunResult whose "
                               "history holds every step's metrics (also written to run_dir/metrics.jsonl)."),
    "eval_performance": ("callbacks", "eval_performance: throughput and timings are always measured: "
                                      "RunResult.summary and the history (samples_per_s, generate_s, train_s, "
                                      "weight_sync_s)."),
    "debug": ("callbacks", "debug: the engine reports through the logging module (coati_relay loggers)."),
    "update_lora_weights": ("lora", "update_lora_weights: with train_model_config['lora'] the engine publishes "
                                    "only the adapters, and producers rebuild W0 + scaling*B@A on each sync "
                                    "(replacing the previous push, not adding to it)."),
    "do_sample": ("generation", "do_sample: the engine always samples (temperature, top_k, top_p)."),
    "pad_token_id": ("generation", "pad_token_id/eos_token_id: taken from the tokenizer saved with the model; "
                                   "each response ends at its EOS token."),
    "eos_token_id": ("generation", "pad_token_id/eos_token_id: taken from the tokenizer saved with the model; "
                                   "each response ends at its EOS token."),
    "use_cache": ("generation", "use_cache: generation always uses a KV cache."),
    "early_stopping": ("generation", "early_stopping: each response ends at its own EOS token."),
    "experience_batch_size": ("generation", "experience_batch_size given to ExperienceMakerHolder landed in the "
                                            "legacy generate() keywords, where it did nothing; the batch size is "
                                            "inference_microbatch_size."),
    "prepare_inputs_fn": ("generation", "prepare_inputs_fn/update_model_kwargs_fn: transformers internals the "
                                        "legacy sampling loop called; not needed."),
    "update_model_kwargs_fn": ("generation", "prepare_inputs_fn/update_model_kwargs_fn: transformers internals the "
                                             "legacy sampling loop called; not needed."),
    "buffer_limit": ("buffer", "buffer_limit={value}: the engine's queue holds at most (n_behind + 1) rounds of "
                               "rollouts and blocks producers beyond that (legacy makers were never throttled); "
                               "n_behind=0, the default, keeps training on-policy."),
    "dataloader_pin_memory": ("buffer", "dataloader_pin_memory: there is no replay DataLoader to pin."),
}


def build_plan(script: LegacyScript) -> Plan:
    """The `Plan` for an analyzed legacy script."""
    return _Mapper(script).build()
