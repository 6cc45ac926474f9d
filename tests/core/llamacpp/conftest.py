"""Fixtures of the llama.cpp runner tests (shared exports live in tests/core/chat/fixtures.py)."""

from tests.core.chat.fixtures import chat_model, f32_gguf, gguf_of  # noqa: F401  (fixtures)
