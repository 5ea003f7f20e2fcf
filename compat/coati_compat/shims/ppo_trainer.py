"""Legacy ``coati.ray.detached_trainer_ppo.DetachedPPOTrainer``: PPO with a critic on the legacy trainer loop.

`DetachedPPOTrainerImpl` keeps the legacy step (legacy_spec §A.4): two Adam optimizers, picked as the engine picks
its optimizer for the plugin (``HybridAdam`` for Gemini and CPU offload, torch's fused Adam elsewhere on CUDA: the
legacy code built HybridAdam under LowLevelZero too, whose kernel takes about 60 s to build), with the legacy
``lr=1e-7``; the clipped policy loss (sample-level, no KL term) against the batch's advantages and the clipped value
loss against its KL-shaped reward, both from ``coati_relay.algorithms``; one optimizer step each per batch through
the strategy's engine backends
(fp16/bf16 models step fp32 master weights where the plugin keeps none; a non-finite loss or weight stops the run at
its step with `coati_relay.training.finite_checks.NonFiniteTrainingError`). Weights go to the makers
with the chunked ``update_experience_maker`` protocol: actor keys are Hugging Face model keys, critic keys
``Critic`` keys; after training only the trainable tensors (with ``update_lora_weights``, only
``lora_A``/``lora_B``) go out, cast to fp16. Each shard goes into the object store once for all makers, packed as
the engine's flat buffers (`coati_relay.exchange.packing.PackedStateDict`, a read-only mapping of the same tensors).

Non-legacy keywords: ``actor_lr`` and ``critic_lr`` set the learning rates (default: the legacy 1e-7);
``rpc_timeout_s`` bounds each step of a weight push. ``DetachedPPOTrainer`` is the Ray actor class.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import ray
import torch

from coati_compat.legacy.callbacks import TrainerCallback, TrainerPerformanceEvaluator
from coati_compat.legacy.experience import Experience
from coati_compat.legacy.lora import LoRAConstructor
from coati_compat.legacy.losses import PolicyLoss, ValueLoss
from coati_compat.legacy.ray_utils import get_model_numel, set_dist_env, state_dict_to
from coati_compat.legacy.tables import LEGACY_LR
from coati_compat.shims.remote import build_strategy, legacy_actor_class
from coati_compat.shims.trainer_base import TRAINER_CONCURRENCY_GROUPS, DetachedTrainer, check_count
from coati_relay.parts import build_optimizer, get_within, put_packed

logger = logging.getLogger(__name__)


class WeightPushError(RuntimeError):
    """A weight push failed on some experience makers; the others received it whole (chunk_end included)."""


def _push_error(failed: Dict[str, BaseException], version: int, completed: List[str]) -> WeightPushError:
    causes = "; ".join(f"{name!r}: {_cause(exc)}" for name, exc in failed.items())
    return WeightPushError(f"weight push {version} failed on experience maker(s) {sorted(failed)} ({causes}). The "
                           f"push was closed (chunk_end) on the makers that opened it, so {completed} go on "
                           "generating with it; restart or remove the failed makers")


def _cause(exc: BaseException) -> str:
    from ray.exceptions import RayActorError

    if isinstance(exc, RayActorError):
        return "the actor died"
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"


def _check_lr(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"DetachedPPOTrainer: {name} must be a positive number, got {value!r}")
    return float(value)


def _legacy_adam(strategy: Any, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam (the legacy form, not AdamW) over ``model``, of the kind the engine picks for the strategy's plugin
    (`coati_relay.training.plugins.build_optimizer`)."""
    return build_optimizer(model.parameters(), lr, getattr(strategy, "plugin_name", None),
                           getattr(strategy, "plugin_options", {}), torch.cuda.is_available(), decoupled=False)


class DetachedPPOTrainerImpl(DetachedTrainer):
    """The legacy PPO trainer. ``model_fn() -> (actor, critic)`` runs here, inside the strategy's init context."""

    _legacy_name = "coati.ray.detached_trainer_ppo.DetachedPPOTrainer"

    def __init__(self, experience_maker_holder_name_list: List[str], strategy_fn: Callable[[], Any],
                 model_fn: Callable[[], Tuple[Any, Any]], env_info: Optional[Dict[str, str]] = None,
                 train_batch_size: int = 8, buffer_limit: int = 0, eps_clip: float = 0.2, value_clip: float = 0.4,
                 dataloader_pin_memory: bool = True, callbacks: Optional[List[TrainerCallback]] = None,
                 eval_performance: bool = False, debug: bool = False, update_lora_weights: bool = False, *,
                 actor_lr: float = LEGACY_LR, critic_lr: float = LEGACY_LR, rpc_timeout_s: float = 600.0) -> None:
        if env_info:
            set_dist_env(env_info)  # first: it announces this rank to its group (`announce_member`)
        actor_lr, critic_lr = _check_lr("actor_lr", actor_lr), _check_lr("critic_lr", critic_lr)
        check_count("DetachedPPOTrainer", "train_batch_size", train_batch_size, 1)  # before any model is built
        self.strategy = build_strategy(strategy_fn, "DetachedPPOTrainer")
        with self.strategy.model_init_context():
            actor, critic = model_fn()
        callbacks = list(callbacks or [])
        if eval_performance:
            callbacks.append(TrainerPerformanceEvaluator(get_model_numel(actor), get_model_numel(critic)))
        actor_optim, critic_optim = (_legacy_adam(self.strategy, model, lr)
                                     for model, lr in ((actor, actor_lr), (critic, critic_lr)))
        (self.actor, self.actor_optim), (self.critic, self.critic_optim) = self.strategy.prepare(
            (actor, actor_optim), (critic, critic_optim))
        self.actor_loss_fn = PolicyLoss(eps_clip)
        self.critic_loss_fn = ValueLoss(value_clip)
        self._update_lora_weights = update_lora_weights
        self.rpc_timeout_s = float(rpc_timeout_s)
        self.weight_version = 0  # completed weight pushes (the initial sync included)
        self.steps_done = 0  # training steps (batches stepped), the replayed epochs included
        super().__init__(experience_maker_holder_name_list, train_batch_size=train_batch_size,
                         buffer_limit=buffer_limit, dataloader_pin_memory=dataloader_pin_memory,
                         callbacks=callbacks, debug=debug)

    @ray.method(concurrency_group="compute")
    def training_step(self, experience: Experience) -> Dict[str, float]:
        """One actor step and one critic step on a batch of B sequences of S tokens with A actions.

        Raises `NonFiniteTrainingError` at the step whose loss or updated weights are inf/NaN.
        """
        self.actor.train()
        self.critic.train()
        num_actions = experience.action_mask.size(1)
        action_log_probs = self.actor(experience.sequences, num_actions, attention_mask=experience.attention_mask)
        actor_loss = self.actor_loss_fn(action_log_probs, experience.action_log_probs, experience.advantages,
                                        action_mask=experience.action_mask)
        self.strategy.backward(actor_loss, self.actor, self.actor_optim, loss_name="actor_loss", batch=experience)
        self.strategy.optimizer_step(self.actor_optim)
        self.actor_optim.zero_grad()

        values = self.critic(experience.sequences, action_mask=experience.action_mask,
                             attention_mask=experience.attention_mask)
        critic_loss = self.critic_loss_fn(values, experience.values, experience.reward,
                                          action_mask=experience.action_mask)
        self.strategy.backward(critic_loss, self.critic, self.critic_optim, loss_name="critic_loss",
                               batch=experience)
        self.strategy.optimizer_step(self.critic_optim)
        self.critic_optim.zero_grad()
        self.steps_done += 1
        return {"actor_loss": actor_loss.item(), "critic_loss": critic_loss.item()}

    # -- weight push ---------------------------------------------------------------------------------------------
    def _get_model_state_dict_shard(self, model: torch.nn.Module, fully_update: bool = False,
                                    **config: Any) -> Iterator[Dict[str, torch.Tensor]]:
        for state_dict in self.strategy.get_model_state_dict_shard(model, **config):
            if self._update_lora_weights and not fully_update:
                state_dict, _ = LoRAConstructor.filter_state_dict_lora(state_dict)
            yield state_dict_to(state_dict)

    def _get_model_lora_config_dict(self, model: torch.nn.Module) -> Optional[Dict[str, Any]]:
        if not self._update_lora_weights:
            return None
        return LoRAConstructor.extract_lora_config(self.strategy.unwrap_model(model))

    @ray.method(concurrency_group="model_io")
    @torch.no_grad()
    def _update_remote_makers(self, fully_update: bool = False, **config: Any) -> None:
        """chunk_start on every maker (each takes its model lock), the actor and critic shards, then chunk_end.

        A maker whose chunk_start fails (it died) gets nothing more, but every maker that opened the push gets its
        chunk_end, so the others go on generating; the push then raises `WeightPushError`
        naming the failed makers."""
        if not fully_update:
            config["requires_grad_only"] = True
        self.update_target_holder_list()
        names = self.target_holder_name_list
        if len(names) != len(self.target_holder_list):  # handles set without their names
            names = [f"#{i}" for i in range(len(self.target_holder_list))]
        holders = dict(zip(names, self.target_holder_list))
        failed: Dict[str, BaseException] = {}
        opened = self._settle({n: [h.update_experience_maker.remote(chunk_start=True, fully_update=fully_update)]
                               for n, h in holders.items()}, failed)
        refs: Dict[str, List[Any]] = {n: [] for n in opened}
        if opened:
            for key, model in (("actor", self.actor), ("critic", self.critic)):
                lora_config = self._get_model_lora_config_dict(model)
                for shard in self._get_model_state_dict_shard(model, fully_update=fully_update, **config):
                    shard_ref, _ = put_packed(shard)  # one flat copy in the object store for every maker
                    for name in opened:
                        refs[name].append(holders[name].update_experience_maker.remote(
                            **{f"new_{key}_state_dict": shard_ref, f"new_{key}_lora_config_dict": lora_config},
                            fully_update=fully_update))
        self._settle(refs, failed)
        self._settle({n: [holders[n].update_experience_maker.remote(chunk_end=True, fully_update=fully_update)]
                      for n in opened}, failed)
        if failed:
            raise _push_error(failed, self.weight_version + 1, [n for n in holders if n not in failed]) \
                from next(iter(failed.values()))
        self.weight_version += 1
        self.detached_replay_buffer.version = self.weight_version

    def _settle(self, refs: Dict[str, List[Any]], failed: Dict[str, BaseException]) -> List[str]:
        """Waits (``rpc_timeout_s`` each) for every maker's calls; records a maker's first error in ``failed``.
        Returns the makers whose calls all succeeded."""
        done = []
        for name, calls in refs.items():
            try:
                get_within(calls, self.rpc_timeout_s, f"weight push to experience maker {name!r}")
                done.append(name)
            except Exception as exc:  # RayActorError (died), RayTaskError (a load raised), TimeoutError
                failed.setdefault(name, exc)
        return done

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def strategy_save_actor(self, path: str, only_rank0: bool = False) -> None:
        self.strategy.save_model(self.actor, path, only_rank0=only_rank0)

    def strategy_save_critic(self, path: str, only_rank0: bool = False) -> None:
        self.strategy.save_model(self.critic, path, only_rank0=only_rank0)

    def strategy_save_actor_optim(self, path: str, only_rank0: bool = False) -> None:
        self.strategy.save_optimizer(self.actor_optim, path, only_rank0=only_rank0)

    def strategy_save_critic_optim(self, path: str, only_rank0: bool = False) -> None:
        self.strategy.save_optimizer(self.critic_optim, path, only_rank0=only_rank0)

    # -- non-legacy ----------------------------------------------------------------------------------------------
    def get_weight_version(self) -> int:
        """Completed weight pushes so far."""
        return self.weight_version


DetachedPPOTrainer = legacy_actor_class(DetachedPPOTrainerImpl, TRAINER_CONCURRENCY_GROUPS)
