"""Names legacy scripts import from transformers that transformers 5 moved.

``from transformers.modeling_utils import no_init_weights`` fails on transformers 5, where the context manager
lives in ``transformers.initialization`` and takes no argument. ``install_moved_names()`` (run when the legacy
surface is imported, before the script's own transformers imports in every upstream script) sets
``transformers.modeling_utils.no_init_weights`` to :func:`no_init_weights`, which accepts the legacy ``_enable``
flag. ``from transformers import BloomTokenizerFast`` (removed in transformers 5, where BLOOM checkpoints load
through ``AutoTokenizer``) gets `BloomTokenizerFast`, a ``PreTrainedTokenizerFast`` that pads on the left as the
legacy class did. Nothing is changed where the name still exists.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def no_init_weights(_enable: bool = True) -> Iterator[None]:
    """Skips weight initialisation of models built inside the block (legacy signature; ``_enable=False``: no-op)."""
    if not _enable:
        yield
        return
    from transformers.initialization import no_init_weights as moved

    with moved():
        yield


def _bloom_tokenizer_class() -> type:
    from transformers import PreTrainedTokenizerFast

    class BloomTokenizerFast(PreTrainedTokenizerFast):
        """The legacy BLOOM tokenizer class: a fast tokenizer from ``tokenizer.json``, left padding."""

        padding_side = "left"
        model_input_names = ["input_ids", "attention_mask"]

    return BloomTokenizerFast


def install_moved_names() -> None:
    """Adds the moved names back to their legacy modules when they are missing there (idempotent)."""
    import transformers
    import transformers.modeling_utils as modeling_utils

    if not hasattr(transformers, "BloomTokenizerFast"):
        transformers.BloomTokenizerFast = _bloom_tokenizer_class()
        logger.debug("transformers.BloomTokenizerFast restored for legacy scripts")

    if not hasattr(modeling_utils, "no_init_weights"):
        modeling_utils.no_init_weights = no_init_weights
        logger.debug("transformers.modeling_utils.no_init_weights restored for legacy scripts")
