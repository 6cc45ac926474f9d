"""The window's process heap, kept out of the cycle collector's full passes once start-up is done.

After torch, transformers, pyqtgraph and numba are imported the process holds ~250,000 long-lived
objects, and each full (generation-2) pass of Python's cycle collector walks all of them: ~150 ms on
this class of machine, more in a long session. That pass runs on whichever thread happens to allocate
when the thresholds trip, often the GUI thread in the middle of filling a table, so the window froze
for longer than any of its own work. Freezing the start-up heap (``gc.freeze``) moves those objects to
a permanent generation that no pass walks; what is made afterwards is collected as before."""

from __future__ import annotations

import gc


def settle_heap() -> int:
    """Collect the young generations, then freeze every object alive now; returns how many are frozen."""
    gc.collect(1)  # the young garbage of the imports is not worth keeping forever
    gc.freeze()
    return gc.get_freeze_count()
