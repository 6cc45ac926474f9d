"""The cache manager over downloads made by studio.core.hub."""

from __future__ import annotations

import pytest

from studio.core.hub import download
from studio.core.hub.cache import cached_path, delete_cached, find_leftovers, list_cached, remove_leftovers
from studio.core.hub.errors import OfflineError
from studio.core.hub.paths import PARTIAL_SUFFIX, default_cache_dir, repo_cache_path
from tests.core.hub.fakehub import Fault


def test_list_open_and_delete(hub):
    llama = download("tiny-org/tiny-llama")
    gguf = download("tiny-org/tiny-llama-GGUF", include="*Q4_K_M*")
    models = {m.repo_id: m for m in list_cached(hub.cache_dir)}
    assert set(models) == {"tiny-org/tiny-llama", "tiny-org/tiny-llama-GGUF"}
    m = models["tiny-org/tiny-llama"]
    assert m.size_on_disk == sum(len(b) for b in hub.repos["tiny-org/tiny-llama"].files.values())
    assert m.n_files == 5 and m.revisions[0].refs == ("main",) and m.revisions[0].path == llama
    assert m.to_json()["revisions"][0]["commit"] == hub.repos["tiny-org/tiny-llama"].commit
    assert cached_path("tiny-org/tiny-llama", cache_dir=hub.cache_dir) == llama
    assert cached_path("tiny-org/tiny-llama-GGUF", cache_dir=hub.cache_dir) == gguf
    freed = delete_cached("tiny-org/tiny-llama-GGUF", "main", hub.cache_dir)
    assert freed == len(hub.repos["tiny-org/tiny-llama-GGUF"].files["tiny-llama-Q4_K_M.gguf"])
    assert not gguf.exists()
    freed = delete_cached("tiny-org/tiny-llama", cache_dir=hub.cache_dir)
    assert freed >= m.size_on_disk
    assert not repo_cache_path(hub.cache_dir, "tiny-org/tiny-llama").exists()
    assert [m.repo_id for m in list_cached(hub.cache_dir)] in ([], ["tiny-org/tiny-llama-GGUF"])
    with pytest.raises(OfflineError, match="not in the local cache"):
        cached_path("tiny-org/tiny-llama", cache_dir=hub.cache_dir)
    with pytest.raises(OfflineError, match="nothing to delete"):
        delete_cached("tiny-org/tiny-llama", cache_dir=hub.cache_dir)


def test_partials_are_counted_and_offered_for_cleanup(hub, waits):
    hub.add_fault(Fault("drop", path="*/model.safetensors", after_bytes=1000, times=None))
    with pytest.raises(Exception, match="Consistency check failed"):
        download("tiny-org/tiny-llama")
    models = list_cached(hub.cache_dir)
    assert models[0].partial_bytes == 5000
    leftovers = [x for x in find_leftovers(hub.cache_dir) if x.kind == "partial"]
    assert len(leftovers) == 1 and leftovers[0].path.name.endswith(PARTIAL_SUFFIX)
    assert remove_leftovers(leftovers) == 5000
    assert not [x for x in find_leftovers(hub.cache_dir) if x.kind == "partial"]


def test_empty_or_missing_cache(tmp_path):
    assert list_cached(tmp_path / "nothing") == []
    assert find_leftovers(tmp_path / "nothing") == []


def test_default_cache_dir_follows_environment_at_call_time(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"
