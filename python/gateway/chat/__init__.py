"""Prompt encoders: normalised messages + tools -> prompt text (dsml, glm, qwen, a sandboxed
Jinja renderer).  Which encoder a checkpoint uses, and everything else about its family, is
gateway.families."""
from .types import ChatEncodingError, ChatTemplateError

__all__ = ["ChatEncodingError", "ChatTemplateError"]
