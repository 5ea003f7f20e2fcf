"""``coati-relay compare``: a legacy script and its migration, run side by side on the same arguments.

- ``recording``: the recorders the shims take as observers (`coati_compat.observers`) while
  ``$COATI_RELAY_COMPARE_EVENTS`` is set.
- ``function_recording``: the same records from the legacy functions a script with its own Ray actors calls.
- ``legacy_launch``: runs the legacy script unchanged with recording on (CPU mode on a host without CUDA).
- ``process_memory``: peak memory per role over a run's process tree.
- ``sides``: runs one side as a process of its own, stopped at the step budget.
- ``steps``: per-step rows from the recorded events (legacy) and from ``metrics.jsonl`` (migrated).
- ``verdicts``: the same-within-noise / better / worse rule.
- ``explanations``: the deviations and rewriter NOTEs that explain each quantity.
- ``report``: the tables, ``compare.json``, ``report.md`` and the PNG.
- ``cli``: the subcommand.
"""
