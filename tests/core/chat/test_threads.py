"""The columns' share of the cores (issue 26): equal whole shares of the free cores, at least one thread, said in words."""

from __future__ import annotations

from types import SimpleNamespace

from studio.core.chat import threads as chat_threads


def test_equal_shares_without_oversubscription():
    assert chat_threads.share(1, cores=2, busy=0).threads == 2
    assert chat_threads.share(2, cores=2, busy=0).threads == 1
    assert chat_threads.share(3, cores=8, busy=0).threads == 2
    s = chat_threads.share(3, cores=2, busy=0)
    assert s.threads == 1 and s.oversubscribed
    assert not chat_threads.share(2, cores=2, busy=0).oversubscribed


def test_cores_other_programs_keep_busy_are_left_to_them():
    # on 2 cores at load 20, two spinning threads per model ran 20 times slower than one
    s = chat_threads.share(1, cores=2, busy=20.0)
    assert s.threads == 1 and s.limited_by_load
    assert chat_threads.share(1, cores=16, busy=6.0).threads == 10
    assert chat_threads.share(2, cores=16, busy=6.0).threads == 5
    assert chat_threads.share(2, cores=16, busy=0.5).threads == 7


def test_descriptions_for_the_column_header():
    assert chat_threads.share(1, cores=2, busy=0).describe() == "2 threads of 2 cores"
    assert chat_threads.share(2, cores=2, busy=0).describe() == "1 thread of 2 cores (2 models share them)"
    assert "more than the cores" in chat_threads.share(3, cores=2, busy=0).describe()
    assert (
        chat_threads.share(1, cores=2, busy=3.25).describe()
        == "1 thread of 2 cores (other programs keep 3.2 cores busy)"
    )


def test_apply_sets_every_backend_that_takes_threads():
    seen = []
    a = SimpleNamespace(set_threads=lambda n: seen.append(("a", n)))
    b = SimpleNamespace()  # a back end without threads is left alone
    s = chat_threads.apply([a, b], cores=4, busy=0)
    assert s.threads == 2 and seen == [("a", 2)]


def test_cpu_cores_and_load_are_read_from_the_os():
    assert chat_threads.cpu_cores() >= 1 and chat_threads.busy_cores() >= 0


def test_busy_cores_leaves_out_the_studios_own_recent_work(tmp_path, monkeypatch):
    f = tmp_path / "loadavg"
    f.write_text("1.50 1.20 0.90 1/400 12345\n")  # only the reader runs now: the 1.5 was us
    monkeypatch.setattr(chat_threads.os, "getloadavg", lambda: (1.5, 1.2, 0.9))
    assert chat_threads.busy_cores(str(f)) == 0.0
    f.write_text("20.0 18.0 15.0 23/900 12345\n")
    monkeypatch.setattr(chat_threads.os, "getloadavg", lambda: (20.0, 18.0, 15.0))
    assert chat_threads.busy_cores(str(f)) == 20.0


def test_a_process_running_for_a_moment_does_not_take_a_thread(tmp_path, monkeypatch):
    # issue 26: one read of the runnable count saw a passing process as a busy core, and the only
    # column on 2 cores got 1 thread (0.70 × the direct call's tokens/s)
    f = tmp_path / "loadavg"
    f.write_text("1.50 1.20 0.90 3/400 12345\n")  # two others run at the first read …
    reads = []
    monkeypatch.setattr(chat_threads.os, "getloadavg", lambda: (1.5, 1.2, 0.9))

    def gone(seconds):  # … and are gone 2 ms later
        reads.append(seconds)
        f.write_text("1.50 1.20 0.90 1/400 12345\n")

    monkeypatch.setattr(chat_threads.time, "sleep", gone)
    assert chat_threads.busy_cores(str(f)) == 0.0 and len(reads) == 1
    assert chat_threads.share(1, cores=2, busy=chat_threads.busy_cores(str(f))).threads == 2
    # a program that keeps running is seen in every read
    f.write_text("1.50 1.20 0.90 2/400 12345\n")
    monkeypatch.setattr(chat_threads.time, "sleep", lambda s: reads.append(s))
    assert chat_threads.busy_cores(str(f)) == 1.0 and len(reads) == 1 + chat_threads.LOAD_SAMPLES - 1
