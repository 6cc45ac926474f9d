"""Keep transformers' own tqdm bars ("Loading weights", "Writing model shards") out of our output.

The studio reports progress through ``JobContext``; a second bar from transformers garbles the CLI's
progress line and the logs of the GUI's worker threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def no_hf_progress_bars() -> Iterator[None]:
    """Disable transformers' progress bars inside the block, restoring the previous setting after."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
