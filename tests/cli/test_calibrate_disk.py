"""``calibrate -o`` on a disk too small for the imatrix is refused before the long run (issue 25)."""

from __future__ import annotations

import os
import sys

import studio.core.calib.calibrate  # noqa: F401 - loaded, so the test can replace its calibrate()
from studio.cli import main


def test_calibrate_checks_disk_space_before_the_work(llama_model, tmp_path, capsys, monkeypatch):
    real = os.statvfs
    out = tmp_path / "imatrix.gguf"

    class Tiny:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 2  # two blocks free in the output's folder

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny(real(p)) if str(p) == str(tmp_path) else real(p))
    ran = []
    calib_mod = sys.modules["studio.core.calib.calibrate"]  # the module (the package re-exports the function)

    monkeypatch.setattr(
        calib_mod, "calibrate", lambda *a, **k: ran.append(a) or (_ for _ in ()).throw(AssertionError)
    )
    code = main(
        ["calibrate", str(llama_model), "-o", str(out), "--ctx", "64", "--chunks", "1", "--device", "cpu"]
    )
    err = capsys.readouterr().err
    assert code == 2 and ran == [], err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Out of disk space writing" in lines[0] and str(out) in lines[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []
