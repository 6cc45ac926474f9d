"""The one export-and-verify job, for the window and for ``export --verify`` alike.

The file is written to ``OUT.partial``; with verification asked for, the partial file is loaded in
llama.cpp and compared with the original *before* it gets its final name, so Cancel at any point
leaves no output file. A verification that cannot run (transformers does not know the architecture,
a child crashed) is advisory: its one sentence is kept in the outcome and the file is still renamed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.childjob import call_in_child
from studio.core.errors import StudioError, unexpected_error_sentence
from studio.core.export.verify import verify_gguf
from studio.core.export.verify_child import verify_child
from studio.core.jobs import SPAN_STEPS, JobCancelled, JobContext
from studio.core.units import format_bytes

log = logging.getLogger(__name__)

__all__ = [
    "EXPORT_SHARE",
    "ExportOutcome",
    "Verifier",
    "Writer",
    "export_and_verify",
    "verify_here",
    "verify_in_child",
]

EXPORT_SHARE = 0.8  # of the progress when verification follows; the rest is verification

Verifier = Callable[[Path, Path, JobContext], Any]
"""``verify(partial_gguf, source, ctx) -> VerifyResult``: where and how the file is checked."""

Writer = Callable[[JobContext, "Callable[[Path], None] | None"], Any]
"""``write(ctx, validate) -> ExportResult`` (or a ``CalibratedExport``): writes ``OUT.partial``, calls
``validate(partial)`` and renames the file only when it returns."""


@dataclass(frozen=True)
class ExportOutcome:
    """A finished export: what was written, and how close it is to the original (when verified)."""

    result: Any  # studio.core.export.run.ExportResult
    verification: Any = None  # studio.core.export.verify.VerifyResult, or None when not verified
    verify_error: str = ""  # why verification could not run ("" when it ran or was not asked for)
    calibration: Any = None  # studio.core.calib.quantize.CalibratedExport of a calibrated method
    # evaluate.last_word.LastWord: llama.cpp's verdict on a budget plan's file (not ok: kept anyway)
    last_word: Any = None

    @property
    def kept_anyway(self) -> bool:
        """Whether llama.cpp measured the file worse than its plan promised and it was kept anyway."""
        return self.last_word is not None and not self.last_word.ok

    def summary(self) -> str:
        """One line for the status bar."""
        r = self.result
        text = f"Exported {r.path.name}: {format_bytes(r.file_bytes)}, {r.bpw:.2f} bits per weight"
        if self.calibration is not None:
            text += f", {self.calibration.method}"
        v = self.verification
        if v is not None and v.top1_agreement is not None:
            text += f"; quick check: top-1 agreement {100 * v.top1_agreement:.1f} %, mean KL {v.mean_kl:.2e}"
        elif v is not None and v.mean_cosine is not None:
            text += f"; mean cosine {v.mean_cosine:.5f}"
        elif self.verify_error:
            text += "; not verified"
        if self.kept_anyway:
            text += "; KEPT ANYWAY: llama.cpp measures it worse than its plan promised"
        return text + "."


def verify_in_child(device: str = "cpu", *, poll_s: float = 0.1) -> Verifier:
    """A verifier running ``verify.verify_gguf`` in a child process (the window's).

    torch and transformers load the original model there, not in the GUI's process: importing them in
    a worker thread holds the GIL long enough to freeze the window (~0.5 s), and a crash or an
    out-of-memory kill of the child becomes an error sentence. Cancel terminates the child.
    """

    def verify(gguf: Path, source: Path, ctx: JobContext) -> Any:
        # the child is not a daemon: the verification starts llama.cpp in a child process of its own
        return call_in_child(
            verify_child,
            {"gguf": str(gguf), "source": str(source), "device": device},
            what="verification",
            ctx=ctx,
            poll_s=poll_s,
            process_name="verify",
            cancel_grace_s=0.0,  # Cancel terminates the child at once: nothing it would finish is kept
        )

    return verify


def verify_here(
    device: str = "cpu", *, extra_buffers: str = "auto", on_start: Callable[[], None] | None = None
) -> Verifier:
    """A verifier running ``verify.verify_gguf`` in this process (the command line's)."""

    def verify(gguf: Path, source: Path, ctx: JobContext) -> Any:
        if on_start is not None:
            on_start()
        return verify_gguf(gguf, source, device=device, ctx=ctx, extra_buffers=extra_buffers)

    return verify


def export_and_verify(
    ctx: JobContext, source: Path, write: Writer, *, verify: Verifier | None = None
) -> ExportOutcome:
    """Run ``write`` and, with ``verify``, check the partial file against ``source`` before its rename.

    Progress: the write fills the first ``EXPORT_SHARE`` of ``ctx`` (all of it without verification),
    the verification the rest. A ``StudioError`` (or any other failure) of the verification becomes
    ``verify_error``; cancelling during it removes the partial file.
    """
    verified: dict[str, Any] = {}
    share = EXPORT_SHARE if verify is not None else 1.0

    def check(partial: Path) -> None:
        assert verify is not None
        ctx.check_cancelled()
        ctx.report(int(SPAN_STEPS * share), SPAN_STEPS, "Verifying against the original model")
        try:
            verified["result"] = verify(partial, Path(source), ctx.span(share, 1.0))
        except JobCancelled:
            raise  # the writer deletes the partial file: Cancel leaves nothing behind
        except StudioError as err:
            verified["error"] = str(err)
        except Exception as err:  # verification is advisory: its failure must not lose the export
            log.exception("verifying %s failed", partial)
            verified["error"] = unexpected_error_sentence("Verification", err)
        ctx.check_cancelled()

    written = write(ctx.span(0.0, share), check if verify is not None else None)
    calibration = written if hasattr(written, "export") else None
    result = written.export if calibration is not None else written
    return ExportOutcome(result, verified.get("result"), verified.get("error", ""), calibration)
