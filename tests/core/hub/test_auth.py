"""The token: keyring first, never in messages or logs; lock waits cancellable."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from studio.core.hub import AuthRequired, download
from studio.core.hub import auth as auth_mod
from studio.core.hub.paths import repo_cache_path
from studio.core.jobs import JobCancelled, JobContext


@pytest.fixture
def fake_keyring(monkeypatch):
    store: dict[tuple[str, str], str] = {}
    kr = types.ModuleType("keyring")
    kr.get_keyring = lambda: object()
    kr.get_password = lambda s, u: store.get((s, u))
    kr.set_password = lambda s, u, p: store.__setitem__((s, u), p)
    kr.delete_password = lambda s, u: store.pop((s, u), None)
    backends = types.ModuleType("keyring.backends")
    fail = types.ModuleType("keyring.backends.fail")

    class FailKeyring:  # the type keyring uses when no backend exists
        pass

    fail.Keyring = FailKeyring
    monkeypatch.setitem(sys.modules, "keyring", kr)
    monkeypatch.setitem(sys.modules, "keyring.backends", backends)
    monkeypatch.setitem(sys.modules, "keyring.backends.fail", fail)
    return store


def test_token_goes_to_keyring_and_comes_back(fake_keyring, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert auth_mod.keyring_available()
    assert auth_mod.store_token(" hf_abc123 ")
    assert fake_keyring == {("quant-studio", "huggingface-token"): "hf_abc123"}
    token, source = auth_mod.get_token()
    assert token == "hf_abc123" and source.origin == "keyring" and "hf_abc" not in repr(source)
    auth_mod.forget_token()
    assert fake_keyring == {}


def test_without_keyring_nothing_is_stored(monkeypatch):
    monkeypatch.setitem(sys.modules, "keyring", None)  # import fails
    assert not auth_mod.keyring_available()
    assert auth_mod.store_token("hf_x") is False
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert auth_mod.get_token()[0] == "hf_from_env"


def test_token_never_appears_in_messages_logs_or_progress(hub, waits):
    secret = "hf_super_secret_value_42"
    lines, notes = [], []
    ctx = JobContext(on_log=lines.append, on_progress=lambda d, t, m: notes.append(m))
    with pytest.raises(AuthRequired) as info:
        download(
            "gated-org/gated-llama", token=secret, ctx=ctx, on_progress=lambda p: notes.append(p.message)
        )
    everything = " ".join([str(info.value), *lines, *notes])
    assert secret not in everything
    assert auth_mod.redact(f"Bearer {secret}", secret) == "Bearer hf_***"


def test_waiting_for_another_downloads_lock_is_visible_and_cancellable(hub):
    from filelock import FileLock

    repo = hub.repos["tiny-org/tiny-llama"]
    lock_path = hub.cache_dir / ".locks" / repo_cache_path(hub.cache_dir, "tiny-org/tiny-llama").name
    lock_path.mkdir(parents=True)
    held = FileLock(str(lock_path / f"{repo.sha256('model.safetensors')}.lock"))
    held.acquire()
    try:
        ctx = JobContext()
        waiting = threading.Event()
        errors = []

        def progress(p):
            if "waiting for another download" in p.message:
                waiting.set()

        def run():
            try:
                download("tiny-org/tiny-llama", ctx=ctx, on_progress=progress)
            except BaseException as err:  # noqa: BLE001
                errors.append(err)

        t = threading.Thread(target=run)
        t.start()
        assert waiting.wait(10)
        ctx.cancel()
        t.join(5)
        assert not t.is_alive() and isinstance(errors[0], JobCancelled)
    finally:
        held.release()
