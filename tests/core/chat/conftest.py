"""Fixtures of the chat tests (shared exports live in tests/core/chat/fixtures.py)."""

from tests.core.chat.fixtures import (  # noqa: F401  (fixtures)
    canary,
    chat_model,
    f32_gguf,
    gguf_of,
    plain_model,
)
