"""``calibrate_then_scan``: the one order of a face's scan (calibrate, then imatrix, then scan), with
the imatrix and the scan cached where the CLI and the window both find them."""

from __future__ import annotations

import numpy as np

from studio.core.calib.pipeline import calibrate_then_scan, scan_imatrix
from studio.core.calib.sensitivity import ScanSettings
from studio.core.jobs import JobContext
from studio.core.model import open_model

SETTINGS = ScanSettings(types=("Q4_0", "Q8_0"), n_ctx=16, n_chunks=1, calib_ctx=32, calib_chunks=2)


def _messages() -> tuple[JobContext, list[str]]:
    said: list[str] = []
    return JobContext(on_progress=lambda d, t, m: said.append(m), min_interval=0), said


def test_the_first_scan_calibrates_and_caches_the_next_reuses(llama_model, calib_text, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    with open_model(llama_model) as ck:
        info = ck.info
    ctx, said = _messages()
    first = calibrate_then_scan(info, str(calib_text), SETTINGS, ctx=ctx)
    assert first.calibrated and "Calibrating (importance matrix), step 1 of 2" in said
    assert list((tmp_path / "cache" / "sensitivity").glob("imatrix-*.gguf"))  # the file the CLI reads
    ctx, said = _messages()
    again = calibrate_then_scan(info, str(calib_text), SETTINGS, ctx=ctx)
    assert not again.calibrated and not any(m.startswith("Calibrating") for m in said)
    assert again.scan.key == first.scan.key and again.scan.tensors == first.scan.tensors
    im, calibrated = scan_imatrix(info, str(calib_text), calib_ctx=32, calib_chunks=2, ctx=JobContext())
    assert not calibrated and set(im) == set(first.imatrix)
    for name in im:
        assert np.array_equal(im[name], first.imatrix[name])


def test_a_given_imatrix_is_scanned_on_without_calibrating(llama_model, calib_text, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    with open_model(llama_model) as ck:
        info = ck.info
    im, _ = scan_imatrix(info, str(calib_text), calib_ctx=32, calib_chunks=2, ctx=JobContext(), cache=False)
    assert not (tmp_path / "cache").exists()  # cache=False: nothing stored
    ctx, said = _messages()
    run = calibrate_then_scan(info, str(calib_text), SETTINGS, imatrix=im, cache=False, ctx=ctx)
    assert run.imatrix is im and not run.calibrated
    assert not any(m.startswith(("Calibrating", "Reading the calibration")) for m in said)
    assert run.scan.tensors and not (tmp_path / "cache").exists()
