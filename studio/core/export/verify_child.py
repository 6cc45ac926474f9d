"""Child-process side of the export job's verification (kept free of Qt so the child starts fast).

The child imports torch and transformers to run the original model; the GUI process never does.
"""

from __future__ import annotations

from typing import Any

from studio.core.export.verify import verify_gguf
from studio.core.jobs import JobContext


def verify_child(ctx: JobContext, emit: Any, gguf: str, source: str, device: str) -> Any:
    """``studio.core.export.verify.verify_gguf`` as a ``studio.core.childjob.call_in_child`` target."""
    return verify_gguf(gguf, source, device=device, ctx=ctx)
