"""The Calibrate page given a GGUF original (issue 38): it converts the file once into the cache as the
first part of the job (the CLI's path, ``hf_folder_for``), says so, calibrates, and the importance matrix
carries the GGUF's own tensor names."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from studio.core.calib import calibrate
from studio.core.calib.imatrix import imatrix_from_stats
from studio.core.model import open_model
from studio.qt.jobs import JobManager
from studio.qt.panels.calibrate_panel import CONVERT_SHARE, CalibratePanel
from studio.qt.state import StudioState
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of
CTX, CHUNKS = 64, 2


@pytest.fixture
def gguf_page(qtbot, chat_model, gguf_of, tmp_path, monkeypatch):
    """(state, jobs, panel, gguf path): the page over the tiny Llama as a lone Q8_0 GGUF, with its own cache."""
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "tiny-q8.gguf"
    src.write_bytes(gguf_of(chat_model, "Q8_0").read_bytes())
    state, jobs = StudioState(), JobManager()
    ckpt = open_model(src)
    panel = CalibratePanel(state, jobs)
    qtbot.addWidget(panel)
    panel.show()
    state.set_checkpoint(ckpt)
    yield state, jobs, panel, src
    jobs.shutdown(10_000)
    ckpt.close()


def test_a_gguf_is_converted_once_in_the_job_and_calibrated(qtbot, gguf_page, tmp_path):
    state, jobs, panel, src = gguf_page
    text = tmp_path / "calib.txt"
    from studio.core.factory import sample_text

    text.write_text(sample_text() * 2, encoding="utf-8")
    assert panel.run_button.isEnabled()
    assert "GGUF file" in panel.status.text() and "float32" in panel.status.text()
    panel.set_text("text", text)
    panel.set_run(ctx=CTX, chunks=CHUNKS, device="cpu")
    seen: list[tuple[float, str]] = []
    jobs.jobChanged.connect(
        lambda j: seen.append((j.fraction or 0.0, j.message)) if j.kind == "calibrate" else None
    )

    with qtbot.waitSignal(panel.calibrated, timeout=120_000):
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        assert "converting it once" in panel.status.text()  # said before the job's first line
    folders = list((tmp_path / "cache" / "gguf-hf").glob("tiny-q8-*"))
    assert len(folders) == 1
    # the conversion reported inside the first part of the bar, then the calibration after it
    conv = [f for f, m in seen if f <= CONVERT_SHARE and "Reading the metadata" in m]
    assert conv and max(f for f, _ in seen) > CONVERT_SHARE

    # the same calibration as the core's on the converted folder; the imatrix names the GGUF's tensors
    with open_model(folders[0]) as ck:
        want = imatrix_from_stats(
            calibrate(folders[0], text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu"), ck.info
        )
    im = state.imatrix
    assert set(im) == set(want) and all(k.startswith("blk.") for k in im)
    assert set(im) <= {t.name for t in state.info.tensors}
    for k in want:
        np.testing.assert_allclose(np.asarray(im[k]), np.asarray(want[k]), rtol=1e-5)
    assert panel.save_imatrix(tmp_path / "m.imatrix.gguf") and panel.load_imatrix(tmp_path / "m.imatrix.gguf")

    # a second run reuses the folder: no conversion, and the status says which folder it runs
    with qtbot.waitSignal(panel.calibrated, timeout=120_000):
        panel.start()
        assert "converted once into the cache" in panel.status.text()
    assert list((tmp_path / "cache" / "gguf-hf").glob("tiny-q8-*")) == folders
