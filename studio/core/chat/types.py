"""Plain data of a chat: messages, sampling settings, streamed tokens and finished generations."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from studio.core.errors import StudioError


class ChatError(StudioError):
    """A chat could not run (model not loaded, prompt too long, generation failed)."""


class PromptTooLongError(ChatError):
    """The prompt does not fit in the model's context window."""

    def __init__(self, n_tokens: int, limit: int, label: str = "") -> None:
        where = f"{label}: " if label else ""
        super().__init__(
            f"{where}prompt too long ({n_tokens} > {limit} tokens).",
            hint="Shorten it, start a new conversation, or allow truncation to keep only its end.",
        )
        self.n_tokens = n_tokens
        self.limit = limit


class Role(str, Enum):
    """Who wrote a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


@dataclass(frozen=True)
class Message:
    """One turn of a conversation."""

    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        """The ``{"role", "content"}`` mapping chat templates expect."""
        return {"role": str(self.role), "content": self.content}


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen; identical settings give identical choices in every back end.

    ``temperature`` 0 means greedy (arg-max). The random draws come from numpy's PCG64 seeded with
    ``seed``, one draw per token, so two back ends with the same logits pick the same tokens.
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ChatError(f"max_tokens must be at least 1, not {self.max_tokens}.")
        if self.temperature < 0:
            raise ChatError(f"temperature must not be negative, not {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ChatError(f"top_p must be in (0, 1], not {self.top_p}.")
        if self.top_k < 0:
            raise ChatError(f"top_k must not be negative, not {self.top_k}.")

    @property
    def greedy(self) -> bool:
        """Whether the choice is the arg-max token."""
        return self.temperature == 0.0

    def as_dict(self) -> dict[str, float | int]:
        """The settings as plain values (sent to the llama.cpp child)."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class TokenEvent:
    """One generated token: its id, the text it added and the model's probability of it."""

    index: int
    token_id: int
    text: str  # may be "" while a multi-byte character is incomplete
    prob: float  # softmax of the raw logits (temperature 1) at the chosen token
    seconds: float = 0.0  # since the request started
    # how long the token waited in its back end before it was handed over (the llama.cpp child sends
    # tokens in batches): it was made ``lag`` seconds before it arrived; tokens/s counts when made
    lag: float = 0.0


class StopReason(str, Enum):
    """Why a generation ended."""

    EOS = "eos"  # the model produced an end-of-generation token
    LENGTH = "length"  # max_tokens reached
    CONTEXT = "context"  # the context window is full
    STOPPED = "stopped"  # the user pressed Stop


@dataclass(frozen=True)
class Prompt:
    """A rendered, tokenized prompt, with the warning of a refused template if any."""

    text: str
    ids: tuple[int, ...]
    template: str  # "model", "fallback" or "none" (plain completion)
    warning: str | None = None
    truncated_from: int | None = None  # original token count when truncation kept only the end
    tokenized_by: str = ""  # label of the back end whose tokenizer made ``ids``


@dataclass(frozen=True)
class GenerationResult:
    """A finished (or stopped) generation and its timings."""

    label: str
    text: str
    tokens: tuple[TokenEvent, ...]
    prompt_tokens: int
    stop_reason: StopReason
    ttft_s: float  # request start → first token (includes prompt processing)
    seconds: float  # request start → end
    tokens_per_s: float  # generated tokens after the first, per second after the first
    prompt: Prompt | None = field(default=None, repr=False)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The generated token ids."""
        return tuple(t.token_id for t in self.tokens)
