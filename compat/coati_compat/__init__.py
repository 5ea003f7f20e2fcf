"""The legacy ``coati.ray`` API of ColossalAI, served on the coati-relay engine.

- ``coati_compat.imports``: the import machinery: the finder that serves the legacy ``coati.*`` paths, the table of
  legacy names, their replacements and the warnings, and the start-up the ``.pth`` line runs (`imports.startup`).
- ``coati_compat.cpu_mode``: GPU-era scripts on hosts without CUDA (``COATI_RELAY_CPU_MODE=1``), and the one
  CUDA-to-CPU redirect (``cpu_mode.redirect``) the shim actors also use.
- ``coati_compat.legacy``: the legacy models, utilities, experience types, strategies and callbacks.
- ``coati_compat.observers``: callbacks that tools on top (``compare``) add to every legacy trainer and maker.
- ``coati_compat.shims``: the Ray roles (``DetachedPPOTrainer``, ``ExperienceMakerHolder``, ...).
- ``coati_compat.reference``: the legacy semantics as executable code, the oracle of the equivalence tests.

Importing this package is cheap (no torch): the ``.pth`` hook imports it in every interpreter.
"""
