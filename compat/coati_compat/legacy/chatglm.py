"""Legacy ``coati.models.chatglm`` (``ChatGLMActor``) and ``coati.models.chatglm.chatglm_tokenizer``
(``ChatGLMTokenizer``), final release only.

The legacy classes ran ChatGLM-6B's own modelling and SentencePiece tokenizer code, vendored into ``coati``.
coati-relay does not carry that code, so these names exist for imports, ``isinstance`` checks and type hints, and
raise ``NotImplementedError`` on use, naming the replacement: a GLM checkpoint that transformers runs natively
(``GlmForCausalLM``, e.g. ``THUDM/glm-4-9b-chat-hf``, with ``AutoTokenizer``), or any other causal LM, wrapped in
``coati.models.Actor``.
"""
from __future__ import annotations

from typing import Any, NoReturn, Optional

from coati_compat.imports.deprecations import deprecated_api, warn_deprecated
from coati_compat.legacy.model_base import Actor

GUIDE = "migration_guide/README.md#chatglm"

_REPLACEMENT = ("load a GLM checkpoint that transformers runs natively (GlmForCausalLM, e.g. a local copy of "
                "THUDM/glm-4-9b-chat-hf) with transformers.AutoModelForCausalLM.from_pretrained(<local path>) and "
                "wrap it as coati.models.Actor(model); its tokenizer loads with "
                "transformers.AutoTokenizer.from_pretrained(<local path>)")


def _unavailable(name: str) -> NoReturn:
    raise NotImplementedError(f"{name} is not available in coati-relay: it ran ChatGLM-6B's vendored modelling and "
                              f"tokenizer code, which coati-relay does not carry. Instead, {_REPLACEMENT}. "
                              f"See {GUIDE}")


@deprecated_api("coati.models.chatglm.ChatGLMActor")
class ChatGLMActor(Actor):
    """The legacy ChatGLM-6B actor (``pretrained``, ``config``, ``checkpoint``); raises NotImplementedError."""

    def __init__(self, pretrained: Optional[str] = None, config: Any = None, checkpoint: bool = False) -> None:
        _unavailable("ChatGLMActor")


@deprecated_api("coati.models.chatglm.chatglm_tokenizer.ChatGLMTokenizer")
class ChatGLMTokenizer:
    """The legacy ChatGLM-6B tokenizer; constructing it or ``from_pretrained`` raises NotImplementedError."""

    padding_side = "left"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _unavailable("ChatGLMTokenizer")

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> NoReturn:
        warn_deprecated("coati.models.chatglm.chatglm_tokenizer.ChatGLMTokenizer")
        _unavailable("ChatGLMTokenizer")


__all__ = ["ChatGLMActor", "ChatGLMTokenizer"]
