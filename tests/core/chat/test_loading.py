"""A column's model loads once however many threads ask (its own loading job and an early Send)."""

from __future__ import annotations

import threading
import time

from studio.core.chat.loading import load_seconds, load_timed


class SlowBackend:
    def __init__(self) -> None:
        self.loaded = False
        self.loads = 0

    def load(self, ctx=None) -> None:
        self.loads += 1
        time.sleep(0.2)
        self.loaded = True


def test_two_callers_share_one_load_and_its_time():
    b = SlowBackend()
    got: list[float] = []
    threads = [threading.Thread(target=lambda: got.append(load_timed(b))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.loads == 1 and len(got) == 2
    assert got[0] == got[1] == load_seconds(b) and got[0] >= 0.2
    assert load_timed(b) == got[0] and b.loads == 1
