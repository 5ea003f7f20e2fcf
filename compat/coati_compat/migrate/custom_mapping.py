"""The rewriter's step for a script's own classes (`coati_compat.migrate.custom_code`): what goes into the plan.

`carry_classes` runs where the mapping meets the custom classes and returns the names it carried; `finish` runs
after the algorithm is mapped and sets the run up for the carried loss (its name, RLOO advantages, no critic; or, with
a carried value loss, PPO and its critic) and the hooks (``callbacks=[...]`` in ``main()``).
"""
from __future__ import annotations

import ast
from typing import List, Optional, Set

from coati_compat.migrate.builder import MappingContext, Plan
from coati_compat.migrate.custom_code import (
    CarriedLoss,
    carry_callback,
    carry_loss,
    class_node,
    legacy_imports,
    other_imports,
)
from coati_compat.migrate.expressions import source
from coati_compat.migrate.notes import Note

GROUP_SIZE = 2  # responses per prompt: RLOO's leave-one-out baseline needs two


def carry_classes(b: MappingContext) -> Set[str]:
    """Carries the trainer subclasses with a loss and the callback classes; returns their names."""
    s, carried = b.script, set()
    imports = legacy_imports(s.tree)
    b.carried_loss = None
    for c in s.custom_classes:
        if c.kind == "trainer" and c.base == "DetachedTrainer":
            loss, why = carry_loss(class_node(s.tree, c), imports)
            if loss is None:
                b.untranslated(f"{c.name}({c.base}) defines its own training step, which the rewriter cannot carry "
                               f"as a loss: {why}. Write it as a registered policy loss (with a critic, a value "
                               f"loss too: migration_guide/custom_code.md); the call below uses core_algo='PPO' as "
                               f"the closest stand-in.",
                               c.line)
            else:
                b.carried_loss = loss
            carried.add(c.name)
    metrics = b.carried_loss.metrics if b.carried_loss else {}
    for c in s.custom_classes:
        if c.kind == "callback":
            b.plan.user_code += carry_callback(class_node(s.tree, c), c.base, metrics) + ["", ""]
            b.note("custom-classes", f"the callback class {c.name}({c.base}) is carried as a hook class below and "
                                     f"passed as launch_distributed(callbacks=[...]) in main().", line=c.line)
            carried.add(c.name)
    if b.carried_loss:
        b.plan.user_code += b.carried_loss.source + ["", ""]
        if b.carried_loss.value_loss:
            b.plan.user_code += b.carried_loss.value_loss.source + ["", ""]
    b.plan.user_imports += sorted(set(other_imports(s.tree, b.plan.user_code)) | (
        b.carried_loss.imports if b.carried_loss else set()))
    return carried


def finish(b: MappingContext) -> None:
    """The run of a carried loss (by name, RLOO, no critic) and the hooks of the trainer's and makers' callbacks."""
    loss: Optional[CarriedLoss] = getattr(b, "carried_loss", None)
    p = b.plan
    if loss is not None and loss.value_loss is not None:
        _with_critic(b, loss)
    elif loss is not None:
        grpo = ast.parse(p.kwargs["grpo_config"], mode="eval").body
        kept = {ast.literal_eval(k): v for k, v in zip(grpo.keys, grpo.values)
                if ast.literal_eval(k) in ("lr", "ppo_epochs")}
        # The legacy trainer's own optimizer: Adam at a constant lr, no weight decay.
        kept.update(beta=ast.Constant(0.0), policy_loss=ast.Constant(loss.class_name),
                    lr_scheduler=ast.Constant("constant"), weight_decay=ast.Constant(0.0))
        p.kwargs["grpo_config"] = "{" + ", ".join(f"{k!r}: {source(v)}" for k, v in kept.items()) + "}"
        p.kwargs["core_algo"] = '"RLOO"'
        gen = ast.parse(p.kwargs["generate_config"], mode="eval").body
        sampling = {ast.literal_eval(k): source(v) for k, v in zip(gen.keys, gen.values)}
        for key in ("temperature", "top_p"):  # the GRPO family reads both; 1.0 was the legacy generate()'s default
            sampling.setdefault(key, "1.0")
        p.kwargs["generate_config"] = "{" + ", ".join(f"{k!r}: {v}" for k, v in sampling.items()) + "}"
        p.kwargs["num_generations"] = str(GROUP_SIZE)
        p.kwargs.pop("critic_model_config", None)
        p.notes = [n for n in p.notes if n.topic != "kl-and-advantages"]
        b.note("custom-classes", f"{loss.class_name}.training_step is carried as the policy loss {loss.function} "
                                 f"(above), registered in main() as {loss.class_name!r} and named in "
                                 f"grpo_config['policy_loss']. The learner calls it with the log-probs it computed; "
                                 f"the legacy maker's advantage was reward - critic value, here RLOO's "
                                 f"leave-one-out baseline over {GROUP_SIZE} responses per prompt stands in, so no "
                                 f"critic is trained (train_batch_size counts prompts: each step sees "
                                 f"{GROUP_SIZE} responses of each). The loss takes no KL term (beta 0, no reference "
                                 f"model); the legacy maker folded kl_coef*KL into the reward: add beta * "
                                 f"per_token_kl in the loss and set grpo_config['beta'] to keep one. The optimizer "
                                 f"is Adam at a constant lr without weight decay, as the trainer's own was.",
               key="core_algo")
        p.main_prelude += ["from coati_relay.algorithms import register", "",
                           f"register(\"policy_loss\", {loss.class_name!r})({loss.function})"]
    hooks = _callbacks_code(b)
    if hooks:
        p.main_kwargs["callbacks"] = hooks


def _with_critic(b: MappingContext, loss: CarriedLoss) -> None:
    """The run of a carried policy and value loss: PPO (GAE advantages from the critic) with both named."""
    p, value = b.plan, loss.value_loss
    grpo = ast.parse(p.kwargs["grpo_config"], mode="eval").body
    kept = {ast.literal_eval(k): source(v) for k, v in zip(grpo.keys, grpo.values)}
    # The legacy trainer's own optimizers: Adam at a constant lr, no weight decay.
    kept.update(policy_loss=repr(loss.class_name), value_loss=repr(value.class_name), lr_scheduler="'constant'",
                weight_decay="0.0")
    p.kwargs["grpo_config"] = "{" + ", ".join(f"{k!r}: {v}" for k, v in kept.items()) + "}"
    p.kwargs["core_algo"] = '"PPO"'
    if "critic_model_config" not in p.kwargs:
        train = ast.parse(p.kwargs["train_model_config"], mode="eval").body
        path = next(source(v) for k, v in zip(train.keys, train.values) if ast.literal_eval(k) == "path")
        p.kwargs["critic_model_config"] = f'{{"path": {path}}}'
    b.note("custom-classes", f"{loss.class_name}.training_step trains an actor and a critic: the actor's loss is "
                             f"carried as the policy loss {loss.function}, the critic's as the value loss "
                             f"{value.function} (above), both registered in main() as {loss.class_name!r} and named "
                             f"in grpo_config['policy_loss'] and ['value_loss']. The run is PPO: the learner trains "
                             f"the critic (critic_model_config) and calls the value loss with its per-token values; "
                             f"the advantages are GAE's over the critic's values, and the value loss's returns (the "
                             f"legacy experience.reward) are GAE's returns, per token. Both optimizers are Adam at "
                             f"a constant lr without weight decay, as the trainer's own were.", key="core_algo")
    p.main_prelude += ["from coati_relay.algorithms import register", "",
                       f"register(\"policy_loss\", {loss.class_name!r})({loss.function})",
                       f"register(\"value_loss\", {value.class_name!r})({value.function})"]


def _callbacks_code(b: MappingContext) -> Optional[str]:
    """``[Hook(args...), ...]`` from the legacy actors' ``callbacks=[...]``, where every item builds a carried
    callback class from flags and literals."""
    names = {c.name for c in b.script.custom_classes if c.kind == "callback"}
    items: List[str] = []
    for site in b.script.trainers[:1] + b.script.makers[:1]:
        node = site.kwargs.get("callbacks")
        if node is None:
            continue
        if isinstance(node, ast.BoolOp) or not isinstance(node, ast.List):
            b.note("unread", f"the callbacks of line {site.line} are not a list literal; pass the hooks as "
                             f"launch_distributed(callbacks=[...]) by hand.", line=site.line)
            continue
        for item in node.elts:
            ok = isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id in names
            args = [b.code(a) for a in item.args] + [b.code(k.value) for k in getattr(item, "keywords", [])]
            if not ok or None in args:
                b.note("unread", f"the callback {source(item)} (line {site.line}) is not a carried class built "
                                 f"from flags and literals; add it to callbacks=[...] by hand.", line=site.line)
                continue
            kws = [f"{k.arg}={b.code(k.value)}" for k in item.keywords]
            items.append(f"{item.func.id}({', '.join(args[:len(item.args)] + kws)})")
    return "[" + ", ".join(items) + "]" if items else None


def for_colossalchat(plan: Plan) -> Plan:
    """ColossalChat's launch_distributed takes neither hooks nor a user's loss: carried code stays NOT TRANSLATED
    there (it runs as written on coati-relay)."""
    if plan.user_code:
        text = ("the carried loss and hooks above need coati-relay: ColossalChat's launch_distributed takes no "
                "callbacks and no registered policy loss; migrate without --target colossalchat to run them.")
        plan.untranslated.append(text)
        plan.notes.append(Note("custom-classes", f"NOT TRANSLATED: {text}"))
        plan.main_kwargs.clear()
    return plan
