"""Offline is quick (issue 26): a Hub whose name does not resolve or whose port is closed ends every
call at once with the same one sentence, in the core, in the CLI and (tests/qt/panels) on the Hub page.

No traffic leaves the machine: the closed port is on 127.0.0.1 and ``.invalid`` never resolves (RFC 2606).
"""

from __future__ import annotations

import socket
import time

import pytest

from studio.cli import main
from studio.core.hub import api, reach
from studio.core.hub.errors import NetworkError

SENTENCE = "cannot be reached"


def closed_port_url() -> str:
    """An http address on 127.0.0.1 where nothing listens (a port bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(params=["closed-port", "unresolvable"])
def dead_hub(request, monkeypatch, tmp_path):
    url = closed_port_url() if request.param == "closed-port" else "http://nonexistent.invalid"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (None, None), raising=False)
    reach.forget()
    why = reach.REFUSED if request.param == "closed-port" else reach.NO_NAME
    return url, str(reach.unreachable_error(url, why))


@pytest.mark.parametrize("call", ["search", "details", "fetch"])
def test_core_calls_end_at_once_with_one_sentence(dead_hub, call):
    url, sentence = dead_hub
    t0 = time.monotonic()
    with pytest.raises(NetworkError) as info:
        if call == "search":
            api.search("llama")
        elif call == "details":
            api.model_details("org/model", with_card=False, with_config=False)
        else:
            api.fetch_bytes("org/model", "config.json")
    assert time.monotonic() - t0 < 3.0
    assert SENTENCE in str(info.value) and url in str(info.value)
    assert str(info.value) == sentence


def test_the_sentence_is_the_same_for_every_call(dead_hub):
    msgs = set()
    for fn in (lambda: api.search("x"), lambda: api.model_details("a/b", with_card=False, with_config=False)):
        with pytest.raises(NetworkError) as info:
            fn()
        msgs.add(str(info.value).split("\n")[0])
    assert len(msgs) == 1


@pytest.mark.parametrize("argv", [["hub", "search", "llama"], ["hub", "info", "org/model"]])
def test_cli_says_it_in_three_seconds(dead_hub, argv, capsys):
    url, _ = dead_hub
    t0 = time.monotonic()
    rc = main(argv)
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2 and took < 3.0, (took, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: The Hub at {url} cannot be reached") and err.count("error:") == 1


def test_a_retry_loop_stops_at_the_first_unreachable_error(monkeypatch):
    # the probe passed (a Hub that went away a moment later): the first refused connection ends the
    # call instead of five tries with backoff
    calls = []

    def refused():
        calls.append(1)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(api, "check_reachable", lambda endpoint: None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.monotonic()
    with pytest.raises(NetworkError, match=SENTENCE):
        api.call_hub(refused, repo_id="a/b")
    assert calls == [1] and time.monotonic() - t0 < 1.0


def test_reasons_are_found_inside_exception_chains():
    try:
        try:
            raise socket.gaierror(-2, "Name or service not known")
        except OSError as inner:
            raise RuntimeError("request failed") from inner
    except RuntimeError as err:
        assert reach.unreachable_reason(err) == reach.NO_NAME
    assert reach.unreachable_reason(OSError("[Errno 111] Connection refused")) == reach.REFUSED
    assert reach.unreachable_reason(TimeoutError("timed out")) is None


def test_a_listening_hub_is_probed_once(monkeypatch):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        reach.forget()
        assert reach.probe(url) is None
        monkeypatch.setattr(reach.socket, "getaddrinfo", lambda *a, **k: pytest.fail("probed again"))
        assert reach.probe(url) is None
