"""The legacy semantics as executable code: the oracle of the equivalence tests and the "old" side of the
benchmarks. Written from legacy_spec.md (reference version ColossalAI ``b5f056636``), independently of the shims
and of ``coati_relay``: nothing in this package imports either.

- ``losses``: ``policy_loss``, ``value_loss``, ``masked_mean``.
- ``experience``: KL estimate and KL-shaped reward, advantage, masks, log-probs, critic and reward-model values,
  the experience step for given sequences, and the legacy split/merge of experience.
- ``lora``: LoRA reconstruction and the legacy accumulating weight push.
- ``ray_helpers``: ``get_receivers_per_sender`` and the legacy ``state_dict_to`` (every tensor to fp16).
- ``replay_buffer``: the batching rules of ``DetachedReplayBuffer`` as a plain-Python model.
- ``orchestration``: the event order of ``fit`` and ``workingloop``, item routing, weight-push calls.
- ``training``: the legacy PPO training step.
"""
