"""Child-process side of the Export dialog's verification (kept free of Qt so the child starts fast).

The child imports torch and transformers to run the original model; the GUI process never does.
"""

from __future__ import annotations

from typing import Any

from studio.core.errors import StudioError
from studio.core.jobs import JobContext


def verify_child_main(out: Any, gguf: str, source: str, device: str) -> None:
    """Run ``studio.core.verify.verify_gguf`` and put ("progress", …), then ("ok", result) or ("error", sentence) on ``out``."""
    from studio.core.verify import verify_gguf

    sink = JobContext(on_progress=lambda d, t, m: out.put(("progress", d, t, m)), min_interval=0.1)
    try:
        out.put(("ok", verify_gguf(gguf, source, device=device, ctx=sink)))
    except StudioError as err:
        out.put(("error", str(err)))
    except BaseException as err:  # one sentence for the dialog; the traceback goes to the child's stderr
        import traceback

        traceback.print_exc()
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        what = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
        out.put(("error", f"Verification failed with an unexpected error ({what})."))
