"""Retry timing shared by Hub API calls and downloads: exponential backoff that honours Retry-After."""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from studio.core.jobs import JobContext

# The tick of a cancellable wait; tests replace it (``monkeypatch.setattr(retry, "_sleep", ...)``).
_sleep = time.sleep
_TICK = 0.1


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a failing request."""

    max_tries: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    # A server asking for a longer pause than this gets a clear error instead of a frozen download.
    max_retry_after: float = 300.0


DEFAULT_POLICY = RetryPolicy()
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait (``Retry-After`` seconds or date, or ``RateLimit: ...;t=N``)."""
    if not headers:
        return None
    value = _get(headers, "Retry-After")
    if value:
        value = value.strip()
        if re.fullmatch(r"\d+(\.\d+)?", value):
            return float(value)
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            return max(0.0, when.timestamp() - time.time())
    ratelimit = _get(headers, "RateLimit")
    if ratelimit:
        m = re.search(r"\bt=(\d+)", ratelimit)
        if m:
            return float(m.group(1))
    return None


def _get(headers: Mapping[str, str], name: str) -> str | None:
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    value = getter(name)
    if value is None:
        value = getter(name.lower())
    return value


def backoff_delay(attempt: int, retry_after: float | None, policy: RetryPolicy = DEFAULT_POLICY) -> float:
    """Seconds to wait before try number ``attempt + 1`` (attempt counts from 1)."""
    if retry_after is not None:
        return max(0.0, retry_after)
    return min(policy.max_delay, policy.base_delay * (2 ** (attempt - 1)))


def cancellable_wait(
    ctx: JobContext, seconds: float, notify: Callable[[str], None] | None, reason: str
) -> None:
    """Wait ``seconds`` while staying cancellable (checked every 0.1 s); announce it first.

    The message reads e.g. "rate-limited, waiting 7 s" so the user sees why nothing moves.
    """
    shown = max(1, math.ceil(seconds)) if seconds > 0 else 0
    msg = f"{reason}, waiting {shown} s"
    ctx.log(msg)
    if notify is not None:
        notify(msg)
    ticks = math.ceil(seconds / _TICK) if seconds > 0 else 0
    for _ in range(ticks):
        ctx.check_cancelled()
        _sleep(_TICK)
    ctx.check_cancelled()
