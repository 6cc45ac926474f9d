"""The window's export and ``export --verify`` verify in the same order: the partial file, before its rename.

Both faces run ``studio.core.export.job.export_and_verify``; the window verifies in a child process
(``call_in_child``), the command line in its own process (``verify_gguf``). Each is observed at the
moment its verification starts, on a real export of a tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.cli import main
from studio.core.errors import StudioError
from studio.core.export import job
from studio.core.export.verify import VerifyResult
from studio.core.jobs import JobContext
from studio.qt.panels.export_dialog import run_export

FAKE = VerifyResult(8, 1.0, 0.0, 0.0, 1.0)


def _seen(gguf: Any, out: Path) -> tuple[str, bool, bool]:
    """(name of the file handed to verification, it exists, the final file exists yet)."""
    p = Path(gguf)
    return p.name, p.is_file(), out.exists()


def test_window_and_cli_verify_the_partial_file_before_the_rename(llama_model, tmp_path, monkeypatch):
    seen: dict[str, list[tuple[str, bool, bool]]] = {"window": [], "cli": []}
    out_w = tmp_path / "window" / "m.gguf"
    out_c = tmp_path / "cli" / "m.gguf"
    out_w.parent.mkdir()
    out_c.parent.mkdir()

    def child(target: Any, kwargs: dict[str, Any], **_kw: Any) -> VerifyResult:
        seen["window"].append(_seen(kwargs["gguf"], out_w))
        return FAKE

    def here(gguf: Any, source: Any, **_kw: Any) -> VerifyResult:
        seen["cli"].append(_seen(gguf, out_c))
        return FAKE

    monkeypatch.setattr(job, "call_in_child", child)
    monkeypatch.setattr(job, "verify_gguf", here)

    outcome = run_export(JobContext(), llama_model, out_w, "Q8_0", verify=True)
    assert main(["export", str(llama_model), "-o", str(out_c), "--preset", "Q8_0", "--verify"]) == 0

    assert seen["window"] == [("m.gguf.partial", True, False)]
    assert seen["cli"] == seen["window"]
    assert outcome.verification is FAKE and outcome.verify_error == ""
    for out in (out_w, out_c):  # renamed after the verification, nothing partial left behind
        assert out.is_file() and not out.with_name(out.name + ".partial").exists()


def test_a_verification_that_cannot_run_keeps_the_file_in_both(llama_model, tmp_path, monkeypatch, capsys):
    def broken(*_a: Any, **_kw: Any) -> VerifyResult:
        raise StudioError("The original model cannot run here.")

    monkeypatch.setattr(job, "call_in_child", broken)
    monkeypatch.setattr(job, "verify_gguf", broken)
    out_w = tmp_path / "w.gguf"
    out_c = tmp_path / "c.gguf"

    outcome = run_export(JobContext(), llama_model, out_w, "Q8_0", verify=True)
    assert outcome.verify_error == "The original model cannot run here." and out_w.is_file()
    assert main(["export", str(llama_model), "-o", str(out_c), "--preset", "Q8_0", "--verify"]) == 2
    assert "error: The original model cannot run here." in capsys.readouterr().err
    assert out_c.is_file()
