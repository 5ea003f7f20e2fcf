"""CPU mode: GPU-era scripts on hosts without CUDA (`patches`: the switch and what it patches; `redirect`: CUDA calls
and CUDA device arguments on the CPU; `thread_hooks`: the per-thread set-up the device-argument mode needs).

Importing this package is cheap (no torch); `coati_compat.imports.startup` imports `patches` only when
``$COATI_RELAY_CPU_MODE`` is set.
"""
