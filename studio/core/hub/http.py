"""A small blocking HTTP client for file bodies, built on ``http.client`` so we own the socket.

Owning the socket is what lets a download be cancelled within a fraction of a second (another thread
shuts the socket down, which wakes a blocked ``recv``), resume with ``Range``, and notice a short or
long body byte-exactly. Metadata calls go through huggingface_hub instead.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import urllib.request
from dataclasses import dataclass
from email.message import Message
from urllib.parse import urljoin, urlsplit

from studio.core.hub.errors import NetworkError

_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 10


@dataclass
class Response:
    """An open response whose body has not been read yet; close it (or use ``with``)."""

    status: int
    headers: Message
    url: str
    _conn: http.client.HTTPConnection
    _resp: http.client.HTTPResponse

    def read(self, n: int) -> bytes:
        """Up to ``n`` body bytes; ``b""`` at the end of the body."""
        return self._resp.read1(n) if hasattr(self._resp, "read1") else self._resp.read(n)

    def abort(self) -> None:
        """Wake up and fail a read blocked in another thread (used by cancel)."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Release the connection."""
        try:
            self._resp.close()
        finally:
            self._conn.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """A connection for ``url`` (through the environment's proxy if any) and the request target."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise NetworkError(f"Cannot download from '{url}': only http and https addresses are supported.")
    host = parts.hostname or ""
    port = parts.port
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme)
    if proxy and urllib.request.proxy_bypass_environment(host):
        proxy = None
    if parts.scheme == "https":
        context = ssl.create_default_context()
        if proxy:
            p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                p.hostname or "", p.port or 8080, timeout=timeout, context=context
            )
            conn.set_tunnel(host, port or 443)
        else:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        return conn, target
    if proxy:
        p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
        return http.client.HTTPConnection(p.hostname or "", p.port or 8080, timeout=timeout), url
    return http.client.HTTPConnection(host, port, timeout=timeout), target


def open_url(
    method: str,
    url: str,
    headers: dict[str, str],
    *,
    timeout: float,
    follow_redirects: bool = True,
    on_connection: callable | None = None,  # type: ignore[valid-type]
) -> Response:
    """Send a request and return the response once its headers arrived (redirects followed).

    ``Authorization`` is dropped when a redirect leaves the original host, so a token never reaches a
    CDN or a third-party mirror. ``on_connection(response_abort)`` is called with an abort function
    for each connection, so a canceller can interrupt the connect or the wait for headers too.
    Low-level failures (refused, reset, timeout) propagate as ``OSError``/``http.client`` errors for
    the caller's retry loop.
    """
    origin = urlsplit(url).netloc
    headers = dict(headers)
    for _ in range(_MAX_REDIRECTS + 1):
        conn, target = _connection(url, timeout)
        if on_connection is not None:
            on_connection(_abort_fn(conn))
        try:
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if follow_redirects and resp.status in _REDIRECTS and resp.getheader("Location"):
            location = urljoin(url, resp.getheader("Location") or "")
            resp.read(64 * 1024)  # small redirect body; we are going elsewhere
            resp.close()
            conn.close()
            if urlsplit(location).netloc != origin:
                headers.pop("Authorization", None)
            if resp.status == 303:
                method = "GET"
            url = location
            continue
        return Response(resp.status, resp.headers, url, conn, resp)
    raise NetworkError(f"Too many redirects while fetching '{url}'; the server or mirror is misconfigured.")


def _abort_fn(conn: http.client.HTTPConnection):  # noqa: ANN202
    lock = threading.Lock()

    def abort() -> None:
        with lock:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    return abort
