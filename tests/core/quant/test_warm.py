"""The block kernels are compiled in a child process, so a window's process only loads them from numba's
cache: compiling holds the GIL for up to a second at a time (the budget dialog's first scan froze the
window 0.5-0.9 s at a time while it compiled 23 types' kernels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from studio.core.quant import warm

ROOT = Path(__file__).resolve().parents[3]


def test_the_child_runs_once_per_install_and_the_marker_spares_it(monkeypatch, tmp_path):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path))
    calls: list[str] = []

    def fake_child(target, kwargs=None, *, what, ctx=None, **_kw):
        calls.append(what)
        return 7

    monkeypatch.setattr(warm, "call_in_child", fake_child)
    monkeypatch.setattr(warm, "_done", [])
    assert warm.ensure_compiled() is True
    assert calls == ["kernel compile"] and warm.marker_path().is_file()
    assert warm.ensure_compiled() is True and len(calls) == 1  # once per process
    monkeypatch.setattr(warm, "_done", [])  # a new process of the same install: the marker spares the child
    assert warm.ensure_compiled() is True and len(calls) == 1
    # the marker is keyed by the kernels' sources: another install (or an edited kernel) compiles again
    monkeypatch.setattr(warm, "kernels_key", lambda also=(): "another")
    monkeypatch.setattr(warm, "_done", [])
    assert warm.ensure_compiled() is True and len(calls) == 2


def test_a_failed_child_is_not_recorded(monkeypatch, tmp_path):
    from studio.core.errors import ChildProcessError_

    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path))

    def dying_child(*_a, **_kw):
        raise ChildProcessError_("The kernel compile process stopped unexpectedly (exit code 1).")

    monkeypatch.setattr(warm, "call_in_child", dying_child)
    monkeypatch.setattr(warm, "_done", [])
    assert warm.ensure_compiled() is False and not warm.marker_path().exists()


SCRIPT = r"""
import json, sys
import numpy as np
from numba.core.registry import CPUDispatcher
from studio.core.calib import _reduce_kernel
from studio.core.quant import blocks, iquants, kquants, legacy, lowbit, warm

ALSO = ("studio.core.calib._reduce_kernel:prepare_kernels",)

if __name__ == "__main__":
    assert warm.ensure_compiled(also=ALSO)
    warm.call_named(ALSO[0])  # the calibration's reductions, loaded here as the window's start-up job does
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    qw = rng.random(1024).astype(np.float32) + 0.1
    qw_ro = qw.copy()
    qw_ro.flags.writeable = False  # the scan's importance matrix is a read-only buffer
    # the scan's and the exports' calls: whole tensors, chunks on two threads, with an imatrix or not
    for name in ("Q8_0", "Q4_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS",
                 "IQ2_S", "IQ3_XXS", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "F16", "BF16"):
        for im in (qw, qw_ro, None):
            if im is None and name in ("IQ2_XXS", "IQ1_S"):
                continue
            blocks.dequantize(blocks.quantize(x, name, imatrix=im, threads=2), name, x.shape)
    hits, compiled = 0, []
    for mod in (kquants, iquants, legacy, lowbit, _reduce_kernel):
        for k, v in vars(mod).items():
            if isinstance(v, CPUDispatcher):
                hits += sum(v.stats.cache_hits.values())
                if sum(v.stats.cache_misses.values()):
                    compiled.append(f"{mod.__name__}.{k}")
    print(json.dumps({"hits": hits, "compiled": compiled}))
"""


@pytest.mark.slow  # compiles every kernel in a fresh numba cache: minutes on a busy machine
def test_after_ensure_compiled_this_process_compiles_no_kernel(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(tmp_path / "numba"),  # a fresh cache: nothing compiled yet
        "QUANT_STUDIO_CACHE": str(tmp_path / "qs"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=1200, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["compiled"] == [] and report["hits"] > 10


def test_the_child_also_runs_the_named_set_ups_and_the_marker_names_them(monkeypatch, tmp_path):
    from studio.core.jobs import null_context

    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path))
    called: list[str] = []
    monkeypatch.setattr(warm, "warm_kernels", lambda ctx=None: 3)
    monkeypatch.setattr(warm, "call_named", called.append)
    assert warm._child(null_context(), lambda _e: None, also=("a.b:c", "d:e")) == 5
    assert called == ["a.b:c", "d:e"]
    # a marker for the block kernels alone does not stand for the calibration's too
    assert warm.marker_path() != warm.marker_path(("a.b:c",))
