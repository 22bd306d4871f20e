"""Per-architecture chat encoders: OpenAI-style messages + tools -> prompt text.

See `registry` for the API the server uses (`encode`, `detect_format`, `load_chat_setup`)."""
from .dsml import FORCE_CALL_OPENER as DSML_FORCE_CALL_OPENER
from .registry import (
    FORMATS,
    ChatFormat,
    ChatSetup,
    detect_format,
    encode,
    forced_call_prefix,
    get_format,
    load_chat_setup,
)
from .types import ChatEncodingError, ChatTemplateError, EncodedPrompt

__all__ = [
    "DSML_FORCE_CALL_OPENER",
    "FORMATS",
    "ChatEncodingError",
    "ChatFormat",
    "ChatSetup",
    "ChatTemplateError",
    "EncodedPrompt",
    "detect_format",
    "encode",
    "forced_call_prefix",
    "get_format",
    "load_chat_setup",
]
