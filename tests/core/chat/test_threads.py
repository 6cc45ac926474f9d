"""The columns' share of the cores (issue 26): equal whole shares, at least one thread, said in words."""

from __future__ import annotations

from types import SimpleNamespace

from studio.core.chat import threads as chat_threads


def test_equal_shares_without_oversubscription():
    assert chat_threads.share(1, cores=2).threads == 2
    assert chat_threads.share(2, cores=2).threads == 1
    assert chat_threads.share(3, cores=8).threads == 2
    s = chat_threads.share(3, cores=2)
    assert s.threads == 1 and s.oversubscribed
    assert not chat_threads.share(2, cores=2).oversubscribed


def test_descriptions_for_the_column_header():
    assert chat_threads.share(1, cores=2).describe() == "2 threads of 2 cores"
    assert chat_threads.share(2, cores=2).describe() == "1 thread of 2 cores (2 models share them)"
    assert "more than the cores" in chat_threads.share(3, cores=2).describe()


def test_apply_sets_every_backend_that_takes_threads():
    seen = []
    a = SimpleNamespace(set_threads=lambda n: seen.append(("a", n)))
    b = SimpleNamespace()  # a back end without threads is left alone
    s = chat_threads.apply([a, b], cores=4)
    assert s.threads == 2 and seen == [("a", 2)]


def test_cpu_cores_is_positive():
    assert chat_threads.cpu_cores() >= 1
