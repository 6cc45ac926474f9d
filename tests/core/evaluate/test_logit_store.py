"""The original's logits kept for scoring: exact, on disk above a size, and never resident as a whole."""

from __future__ import annotations

import errno
import os
import tempfile

import numpy as np
import pytest

from studio.core.errors import EvaluationError
from studio.core.evaluate import evaluate, logit_store
from studio.core.evaluate.logit_store import LogitStore


def _rss_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(field + ":"))


@pytest.mark.parametrize("limit", [0, None])
def test_every_chunk_reads_back_exactly(limit):
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal((7, 33), np.float32) for _ in range(5)]
    store = LogitStore(5, 7, 33, limit=limit)
    assert store.on_disk is (limit == 0) and len(store) == 5 and store.shape == (5, 7, 33)
    for ci in (3, 0, 4, 1, 2):  # in any order
        store[ci] = chunks[ci]
    for ci in (4, 2, 0, 3, 1, 4):
        np.testing.assert_array_equal(store[ci], chunks[ci])
    with pytest.raises(IndexError):
        store[5]
    with pytest.raises(ValueError, match="shape"):
        store[0] = chunks[0][:6]
    folder = store._dir.name if store._dir is not None else None
    store.close()
    assert folder is None or not os.path.exists(folder)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_logits_on_disk_stay_out_of_resident_memory():
    """eval's original logits (4.5 GB at Llama 3's vocabulary on its default text) were a memory map: every
    page written or read stayed resident, and eval on the 2-layer 8B fixture peaked at 6.66 GB. Written and
    read with file I/O, the process holds one chunk at a time."""
    rows, vocab, n = 512, 4096, 8  # 8 MiB a chunk, 64 MiB in all
    store = LogitStore(n, rows, vocab, limit=0)
    chunk = np.full((rows, vocab), 0.5, np.float32)
    before = _rss_kb("RssFile") + _rss_kb("RssAnon")
    for ci in range(n):
        chunk[0, 0] = ci
        store[ci] = chunk
    for ci in range(n):
        got = store[ci]
        assert got[0, 0] == ci and got[1, 1] == 0.5
        del got
    grown = _rss_kb("RssFile") + _rss_kb("RssAnon") - before
    store.close()
    assert grown < 24 * 1024, f"{grown} KiB of 64 MiB of logits stayed resident"


def test_a_full_disk_is_one_sentence():
    store = LogitStore(2, 4, 8, limit=0)

    class Full:
        def seek(self, off):
            return off

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    real, store._f = store._f, Full()
    try:
        with pytest.raises(EvaluationError, match=r"do not fit in .*No space left on device.*--chunks"):
            store[0] = np.zeros((4, 8), np.float32)
    finally:
        store._f = real
        store.close()


def test_eval_with_its_logits_on_disk_scores_as_in_memory(chat_model, gguf_of, monkeypatch, tmp_path):
    """The same report either way, and the temporary file gone afterwards."""
    variant = gguf_of(chat_model, "Q4_K_M")
    kw = {"n_ctx": 64, "max_chunks": 3, "device": "cpu"}
    held = evaluate(chat_model, [variant], **kw)
    monkeypatch.setattr(logit_store, "IN_MEMORY_LIMIT", 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made: list[LogitStore] = []
    real_init = LogitStore.__init__

    def spy(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(LogitStore, "__init__", spy)
    spooled = evaluate(chat_model, [variant], **kw)
    assert len(made) == 1 and made[0].on_disk
    assert not list(tmp_path.glob("quant-studio-eval-*"))
    a, b = held.variants[0], spooled.variants[0]
    assert a.kld_mean > 0 and b.kld_mean == a.kld_mean and b.same_top_pct == a.same_top_pct and b.ppl == a.ppl
