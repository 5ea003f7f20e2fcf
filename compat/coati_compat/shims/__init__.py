"""The legacy ``coati.ray`` roles on the coati-relay engine.

- `replay_buffer`: ``DetachedReplayBuffer`` (``coati.ray.detached_replay_buffer``), stored in the engine's queue;
- `trainer_base`: ``DetachedTrainer`` (``coati.ray.detached_trainer_base``), the abstract trainer users subclass;
- `ppo_trainer`: ``DetachedPPOTrainer`` (``coati.ray.detached_trainer_ppo``), a Ray actor class;
- `maker_holder`: ``ExperienceMakerHolder`` (``coati.ray.experience_maker_holder``), a Ray actor class;
- `remote`: what makes them behave as legacy Ray actor classes on any cluster (``.cuda()`` on hosts without CUDA:
  `coati_compat.cpu_mode.redirect`).

Each role is an implementation class (``DetachedPPOTrainerImpl``, ``ExperienceMakerHolderImpl``) usable without
Ray; the legacy names are the Ray actor classes made from them. Import the submodules (this package imports
nothing, so that the deprecation warnings come from the user's legacy imports).
"""
