"""Rendering chats with a model's template: in the sandbox, in a watched child process (``template_worker``).

``template`` holds the engine (sandbox, budget, fallback); this module is the entry point the chat back
ends and calibration call, so the engine never imports the process that runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from studio.core.chat.template import (
    DEFAULT_TIME_BUDGET_S,
    RenderedChat,
    message_dicts,
    plain_text,
)
from studio.core.chat.template_worker import render_in_child
from studio.core.jobs import JobContext

__all__ = ["render_chat", "render_chats"]


def render_chats(
    template: str | None,
    conversations: Sequence[Sequence[Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    source: str = "the model",
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    max_chars: int | None = None,
    ctx: JobContext | None = None,
) -> list[RenderedChat]:
    """Render each conversation with ``template`` in the sandbox, in a child process; plain
    completion when there is no template.

    The template is compiled once for all conversations. Each one has ``time_budget_s``; a child
    stuck past it (inside C code) is killed, and that conversation and the rest get the built-in
    format with a warning. ``ctx`` sees progress per conversation; cancelling it kills the child
    and raises ``JobCancelled``.
    """
    if not template or not template.strip():
        return [RenderedChat(plain_text(m), "none") for m in conversations]
    return render_in_child(
        template,
        [message_dicts(m) for m in conversations],
        dict(
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            time_budget_s=time_budget_s,
            max_chars=max_chars,
        ),
        source=source,
        ctx=ctx,
    )


def render_chat(
    template: str | None,
    messages: Sequence[Any],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    source: str = "the model",
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    max_chars: int | None = None,
    ctx: JobContext | None = None,
) -> RenderedChat:
    """Render ``messages`` with ``template`` in the sandbox (in a child process); plain completion when there is none.

    ``messages`` are ``Message`` objects or ``{"role", "content"}`` dicts. A template that is refused,
    over budget or broken gives the built-in format and a warning. Cancelling ``ctx`` raises
    ``JobCancelled``.
    """
    return render_chats(
        template,
        [messages],
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
        source=source,
        time_budget_s=time_budget_s,
        max_chars=max_chars,
        ctx=ctx,
    )[0]
