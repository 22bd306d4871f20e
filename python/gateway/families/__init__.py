"""Chat families: one record per family (families/<name>.py), the registry, checkpoint detection.

See docs/ARCHITECTURE.md ("Adding a chat family") for what a family file holds."""
from .checkpoint import ChatSetup, bundled_template, detect_format, gguf_chat_setup, load_chat_setup
from .record import CallSyntax, Family
from .registry import FAMILIES, EncodedPrompt, encode, get_family

__all__ = ["FAMILIES", "CallSyntax", "ChatSetup", "EncodedPrompt", "Family", "bundled_template",
           "detect_format", "encode", "get_family", "gguf_chat_setup", "load_chat_setup"]
