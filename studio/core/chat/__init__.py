"""Chat with a model and its quantized variants side by side, through one back-end protocol.

``TransformersBackend`` runs the original checkpoint (in the calling process; the chat's column is
``TransformersChildBackend``, the same in a child process); ``LlamaCppBackend`` runs any GGUF in a child
process. Both render the model's chat template in our sandbox, sample with the same numpy sampler
and stream ``TokenEvent``s with each token's probability; ``ChatSession`` runs several at once.
Heavy modules (torch, transformers, llama_cpp) are imported only when a back end loads.
"""

from studio.core.chat.backend import BaseBackend, ChatBackend
from studio.core.chat.render import render_chat
from studio.core.chat.session import ChatSession, ColumnOutcome, first_divergence, generate, open_backend
from studio.core.chat.template import RenderedChat
from studio.core.chat.types import (
    ChatError,
    GenerationResult,
    Message,
    Prompt,
    PromptTooLongError,
    Sampling,
    StopReason,
    TokenEvent,
)

__all__ = [
    "BaseBackend",
    "ChatBackend",
    "ChatError",
    "ChatSession",
    "ColumnOutcome",
    "GenerationResult",
    "Message",
    "Prompt",
    "PromptTooLongError",
    "RenderedChat",
    "Sampling",
    "StopReason",
    "TokenEvent",
    "first_divergence",
    "generate",
    "open_backend",
    "render_chat",
]
