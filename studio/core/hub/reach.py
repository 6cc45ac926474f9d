"""Offline is quick: a Hub whose name does not resolve, or whose port refuses, ends a call at once.

Retrying cannot help when the host name has no address or nothing listens on the port, yet
huggingface_hub's own backoff and ours waited 25 s before saying so (issue 26). ``check_reachable``
looks the endpoint's host up and opens one TCP connection before a call (a working endpoint is
remembered for a minute, so a session pays this once); ``unreachable_reason`` recognises the same
two failures inside any exception chain, so a retry loop can stop at the first one. Both end in the
one sentence of ``unreachable_error``.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from urllib.parse import urlsplit

from studio.core.hub.errors import NetworkError

PROBE_TIMEOUT = 2.0  # seconds for the TCP connect; a slow but working Hub is decided by the call itself
REMEMBER_OK = 60.0  # seconds a reachable endpoint is not probed again
NO_NAME = "its host name does not resolve"
REFUSED = "the connection was refused"
_NAME_TEXTS = (
    "name or service not known",
    "nodename nor servname",
    "temporary failure in name resolution",
    "getaddrinfo failed",
    "no address associated with hostname",
    "name resolution",
    "failed to resolve",
)
_REFUSED_TEXTS = ("connection refused", "errno 111", "actively refused", "errno 61", "winerror 10061")

_ok: dict[tuple[str, int], float] = {}
_lock = threading.Lock()


def unreachable_error(endpoint: str, reason: str) -> NetworkError:
    """The one sentence every Hub call ends with when the Hub cannot be reached at all."""
    return NetworkError(
        f"The Hub at {endpoint} cannot be reached ({reason}); check the network connection, "
        "or set HF_HUB_OFFLINE=1 to use the models in the local cache."
    )


def _chain(err: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo = [err]
    while todo and len(seen) < 32:
        e = todo.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        for nxt in (e.__cause__, e.__context__, *getattr(e, "args", ())):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return seen


def unreachable_reason(err: BaseException) -> str | None:
    """``NO_NAME`` or ``REFUSED`` when ``err`` (or an exception behind it) is one of those, else None."""
    for e in _chain(err):
        if isinstance(e, socket.gaierror):
            return NO_NAME
        if isinstance(e, ConnectionRefusedError):
            return REFUSED
        text = str(e).lower()
        if any(t in text for t in _NAME_TEXTS):
            return NO_NAME
        if any(t in text for t in _REFUSED_TEXTS):
            return REFUSED
    return None


def _target(url: str) -> tuple[str, int] | None:
    """The (host, port) a request to ``url`` first connects to: the proxy's when one applies."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    proxy = urllib.request.getproxies_environment().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass_environment(host):
        p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if not p.hostname:
            return None
        try:
            return p.hostname, p.port or 8080
        except ValueError:
            return None
    return host, port


def probe(url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why ``url``'s host cannot be reached (``NO_NAME``, ``REFUSED``), or None when it may be reached."""
    target = _target(url)
    if target is None:
        return None
    now = time.monotonic()
    with _lock:
        if now - _ok.get(target, -REMEMBER_OK) < REMEMBER_OK:
            return None
    host, port = target
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return NO_NAME
    except OSError:
        return None
    refused = False
    for family, kind, proto, _name, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout)
                s.connect(addr)
        except ConnectionRefusedError:
            refused = True
            continue
        except OSError:
            return None  # a timeout or an unreachable route: let the call and its retries decide
        with _lock:
            _ok[target] = time.monotonic()
        return None
    return REFUSED if refused else None


def check_reachable(endpoint: str) -> None:
    """Raise ``unreachable_error`` at once when ``endpoint`` cannot be reached at all."""
    reason = probe(endpoint)
    if reason is not None:
        raise unreachable_error(endpoint, reason)


def forget() -> None:
    """Forget which endpoints answered (tests that close a server and reuse its port)."""
    with _lock:
        _ok.clear()
