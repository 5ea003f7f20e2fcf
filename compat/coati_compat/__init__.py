"""The legacy ``coati.ray`` API of ColossalAI, served on the coati-relay engine.

- ``coati_compat.finder``: the import finder that serves the legacy ``coati.*`` paths (installed by a ``.pth``).
- ``coati_compat.deprecations``: the table of legacy names, their replacements and the warnings.
- ``coati_compat.legacy``: the legacy models, utilities, experience types, strategies and callbacks.
- ``coati_compat.observers``: callbacks that tools on top (``compare``) add to every legacy trainer and maker.
- ``coati_compat.shims``: the Ray roles (``DetachedPPOTrainer``, ``ExperienceMakerHolder``, ...).
- ``coati_compat.reference``: the legacy semantics as executable code, the oracle of the equivalence tests.

Importing this package is cheap (no torch): the ``.pth`` hook imports it in every interpreter.
"""
