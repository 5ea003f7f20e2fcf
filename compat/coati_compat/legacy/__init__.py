"""The legacy ``coati`` modules (models, utilities, experience types, strategies, callbacks, quant), on torch and
transformers. The finder serves them under their legacy paths; importing any of them also restores the names
that transformers 5 moved (see ``transformers_compat``).
"""
from coati_compat.legacy.transformers_compat import install_moved_names

install_moved_names()
