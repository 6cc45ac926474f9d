"""Calibration on a real local Ray cluster: its chunks run as units, and the statistics merged on the
head are the ones the in-process run computes, bit for bit (same thread count)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.core.cluster.conftest import ROOT, ray_or_skip

ray_or_skip()


def test_calibration_statistics_are_the_same_through_the_cluster(local_cluster, llama_model, calib_text):
    from studio.core.calib import calibrate, imatrix_from_stats
    from studio.core.jobs import JobContext
    from studio.core.model import open_model

    kw = dict(n_ctx=64, n_chunks=5, device="cpu", dtype="float32", process_output=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each Ray worker runs
    try:
        here = calibrate(llama_model, calib_text, **kw)
    finally:
        torch.set_num_threads(threads)
    logs, progress = [], []
    ctx = JobContext(on_progress=lambda d, t, m: progress.append(m), on_log=logs.append, min_interval=0)
    there = calibrate(llama_model, calib_text, executor=local_cluster, ctx=ctx, **kw)
    assert any("calibration units on 2 workers" in m for m in logs)  # both workers took chunks
    assert progress[-1].startswith("5/5 calibration chunks")
    assert (there.n_chunks, there.n_ctx, there.dataset) == (here.n_chunks, here.n_ctx, here.dataset)
    assert [s.name for s in there.sites] == [s.name for s in here.sites]
    assert list(there.inputs) == list(here.inputs) and len(here.inputs) > 10
    for name, a in here.inputs.items():
        b = there.inputs[name]
        for f in ("count", "sum_sq", "absmax", "sum_abs", "hist"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), (name, f)
    # q, k and v (gate and up) share one statistics object, as in process
    ids = lambda st: [[k for k in st.inputs if st.inputs[k] is v] for v in st.inputs.values()]  # noqa: E731
    assert ids(there) == ids(here)
    assert len(there.hidden) == len(here.hidden) > 0
    for a, b in zip(here.hidden, there.hidden, strict=True):
        assert (a.layer, a.tokens, a.mean_norm, a.max_norm, a.rms) == (
            b.layer,
            b.tokens,
            b.mean_norm,
            b.max_norm,
            b.rms,
        )
        assert np.array_equal(a.absmax, b.absmax)
    with open_model(llama_model) as ck:
        info = ck.info
    im_here, im_there = imatrix_from_stats(here, info), imatrix_from_stats(there, info)
    assert list(im_here) == list(im_there)
    for k in im_here:
        assert np.array_equal(np.asarray(im_here[k]), np.asarray(im_there[k])), k


def test_calibrate_refuses_int8_on_a_cluster_in_one_sentence(llama_model, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "studio.cli", "calibrate", str(llama_model), "-o", str(tmp_path / "im.gguf"),
         "--int8", "--cluster", "local:2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0
    assert "drop --int8 or --cluster" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "im.gguf").exists()


@pytest.mark.slow  # two CLI runs and a cluster of their own
def test_calibrate_cli_writes_the_same_imatrix_through_the_cluster(llama_model, calib_text, tmp_path):
    import os

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))  # one thread, as each worker runs
    base = ["calibrate", str(llama_model), "--text", str(calib_text), "--ctx", "64", "--chunks", "4",
            "--device", "cpu", "--dtype", "float32"]  # fmt: skip
    runs = {}
    for name, extra in (("here", []), ("there", ["--cluster", "local:2"])):
        out = tmp_path / f"{name}.gguf"
        r = subprocess.run(
            [sys.executable, "-m", "studio.cli", *base, "-o", str(out), *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        runs[name] = (out.read_bytes(), r.stdout, r.stderr)
    assert runs["here"][0] == runs["there"][0]
    assert "4 chunks × 64 tokens" in runs["there"][1]
    assert "calibration units on 2 workers of the local Ray cluster" in runs["there"][2]  # it ran there
    assert "calibration units" not in runs["here"][2]
