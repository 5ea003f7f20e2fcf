"""``coati.trainer.ppo``: the helper that GPU-era Ray scripts import from the legacy PPO trainer module (the
community ``train_prompts_on_ray.py`` calls it to fill its generate keywords)."""
from __future__ import annotations

from typing import Any, Dict

from coati_compat.imports.deprecations import deprecated_api
from coati_compat.legacy.generation import default_generate_kwargs


@deprecated_api("coati.trainer.ppo._set_default_generate_kwargs")
def _set_default_generate_kwargs(strategy: Any, generate_kwargs: Dict[str, Any], actor: Any) -> Dict[str, Any]:
    """A copy of ``generate_kwargs`` with the Hugging Face hooks of ``strategy.unwrap_model(actor)`` (its ``.model``
    when it is a legacy ``Actor``) added where absent (`default_generate_kwargs`)."""
    model = strategy.unwrap_model(actor)
    return default_generate_kwargs(generate_kwargs, getattr(model, "model", model))
