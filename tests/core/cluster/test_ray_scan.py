"""The sensitivity scan on a real local Ray cluster: the same numbers as in process, a killed worker
retried, a lost cluster in one sentence with a resume from the cache, cancel stopping the tasks."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from studio.core.calib.sensitivity import ScanSettings, scan_sensitivity
from studio.core.jobs import JobCancelled, JobContext
from tests.core.cluster.conftest import ROOT, HeadProcess, cmdline, descendants, ray_or_skip

ray_or_skip()

TYPES = ("Q4_0", "Q4_K", "Q8_0", "Q2_K")
EXACT = ScanSettings(types=TYPES, exact=True, n_ctx=32, n_chunks=2, calib_ctx=64, calib_chunks=4)


def _imatrix(model, calib_text):
    from tests.core.calib.test_sensitivity import _imatrix as im

    return im(model, calib_text)


@pytest.fixture(scope="module")
def model_and_imatrix(llama_model, calib_text):
    return llama_model, _imatrix(llama_model, calib_text)


@pytest.fixture(scope="module")
def in_process(model_and_imatrix, calib_text):
    """The exact scan in this process, on one thread (as each Ray worker runs)."""
    model, im = model_and_imatrix
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return scan_sensitivity(model, calib_text, EXACT, imatrix=im)
    finally:
        torch.set_num_threads(threads)


def _same(a, b, rel=1e-6):
    """Every (tensor, type): the same KL to ``rel`` and the same error, bytes and fallback."""
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]  # the scan's tensor order
    n = 0
    for x, y in zip(a.tensors, b.tensors, strict=True):
        assert list(x.by_type) == list(y.by_type)
        for q, cx in x.by_type.items():
            cy = y.by_type[q]
            assert cy.kl == pytest.approx(cx.kl, rel=rel, abs=1e-12), (x.name, q)
            assert (cy.bytes, cy.effective, cy.measured) == (cx.bytes, cx.effective, cx.measured)
            assert cy.error == pytest.approx(cx.error, rel=1e-9), (x.name, q)
            n += 1
    return n


def test_exact_scan_on_two_workers_equals_in_process(
    local_cluster, model_and_imatrix, calib_text, in_process
):
    model, im = model_and_imatrix
    logs = []
    ctx = JobContext(on_progress=lambda d, t, m: logs.append(m), on_log=logs.append, min_interval=0)
    got = scan_sensitivity(model, calib_text, EXACT, imatrix=im, executor=local_cluster, ctx=ctx)
    assert _same(in_process, got) == sum(len(t.by_type) for t in in_process.tensors) > 20
    # per-unit progress with an ETA, and the workers' memory in the log
    pairs = [m for m in logs if "scan pairs" in m]
    n = sum(len(t.by_type) for t in got.tensors)
    assert len(pairs) >= 3 and all("ETA" in m for m in pairs)
    assert pairs[-1].startswith(f"{n}/{n} scan pairs")
    assert any("peak memory per worker" in m for m in logs)


def test_proxy_scan_and_plans_on_the_cluster_equal_in_process(local_cluster, model_and_imatrix, calib_text):
    """The proxy's row samples are drawn on the head in the in-process order; plans run as units."""
    model, im = model_and_imatrix
    st = dataclasses.replace(EXACT, exact=False)
    plan = {"model.layers.0.mlp.down_proj.weight": "Q2_K", "model.layers.1.self_attn.q_proj.weight": "Q4_0"}
    torch.set_num_threads(1)
    try:
        here = scan_sensitivity(model, calib_text, st, imatrix=im, plans=[plan])
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
    there = scan_sensitivity(model, calib_text, st, imatrix=im, plans=[plan], executor=local_cluster)
    _same(here, there)
    assert there.plan_kls == pytest.approx(here.plan_kls, rel=1e-6)
    assert there.check is not None and there.check.pairs == pytest.approx(here.check.pairs, rel=1e-6)


def test_plan_measure_through_the_cluster_equals_in_process(local_cluster, model_and_imatrix, calib_text):
    """``plan --measure``: each plan a unit, the same KL as in process."""
    from studio.core.calib.sensitivity import measure_plans

    model, im = model_and_imatrix
    plans = [
        {"model.layers.0.mlp.down_proj.weight": "Q2_K"},
        {"model.layers.1.self_attn.q_proj.weight": "Q4_0", "model.layers.0.mlp.up_proj.weight": "Q8_0"},
    ]
    torch.set_num_threads(1)
    try:
        here = measure_plans(model, plans, calib_text, EXACT, imatrix=im)
    finally:
        torch.set_num_threads(os.cpu_count() or 1)
    there = measure_plans(model, plans, calib_text, EXACT, imatrix=im, executor=local_cluster)
    assert len(there) == 2 and all(k > 0 for k in there)
    assert there == pytest.approx(here, rel=1e-6)


def _scan_workers() -> list[int]:
    """This test's Ray workers running a scan unit (their process title names the task)."""
    return [p for p in descendants(os.getpid()) if cmdline(p).startswith("ray::scan_unit")]


def test_a_worker_killed_mid_scan_is_retried_with_the_same_numbers(
    local_cluster, model_and_imatrix, calib_text, in_process
):
    model, im = model_and_imatrix
    killed: list[int] = []
    stop = threading.Event()

    def killer() -> None:
        while not stop.is_set() and not killed:
            for pid in _scan_workers():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
            time.sleep(0.005)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    try:
        got = scan_sensitivity(model, calib_text, EXACT, imatrix=im, executor=local_cluster)
    finally:
        stop.set()
        th.join()
    assert killed, "no worker was caught running a scan unit"
    _same(in_process, got)


def test_cancel_stops_the_clusters_tasks_and_writes_nothing(
    local_cluster, model_and_imatrix, calib_text, tmp_path
):
    model, im = model_and_imatrix
    ctx = JobContext(min_interval=0)

    def progress(done, total, msg):
        if "scan pairs" in msg or _scan_workers():
            ctx.cancel()

    ctx.on_progress = progress
    with pytest.raises(JobCancelled):
        scan_sensitivity(
            model, calib_text, EXACT, imatrix=im, executor=local_cluster, cache_dir=tmp_path, ctx=ctx
        )
    deadline = time.monotonic() + 20
    while _scan_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _scan_workers()  # ray.cancel stopped every running unit
    assert not list(tmp_path.glob("sensitivity-*.json"))  # no scan written


def _cli(args, env):
    return subprocess.Popen(
        [sys.executable, "-m", "studio.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_lost_cluster_is_one_sentence_and_a_rerun_resumes(tmp_path, model_and_imatrix, calib_text):
    model, _ = model_and_imatrix
    cache = tmp_path / "cache"
    env = dict(
        os.environ,
        QUANT_STUDIO_CACHE=str(cache),
        RAY_CLIENT_RECONNECT_GRACE_PERIOD="3",
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
    )
    args = [
        "sensitivity", str(model), "--calib-text", str(calib_text), "--calib-ctx", "64", "--calib-chunks", "4",
        "--types", ",".join(TYPES), "--exact", "--scan-ctx", "32", "--scan-chunks", "2", "--json",
    ]  # fmt: skip
    first = HeadProcess(tmp_path)
    try:
        proc = _cli([*args, "--cluster", first.address], env)
        deadline = time.monotonic() + 300
        units: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            units = list(cache.glob("sensitivity/sensitivity-*.units/*.json"))
            if units:
                break
            time.sleep(0.05)
        if not units:  # say which: the deadline, or the scan ended (its error, or done before a poll saw it)
            ended = proc.poll()
            tail = "" if ended is None else proc.communicate(timeout=60)[1][-2000:]
            raise AssertionError(f"no unit seen before the deadline (the scan's exit status: {ended}) {tail}")
        first.kill()
    finally:
        first.kill()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].count(". ") == 0, err[-3000:]
    assert "was lost after" in lines[0] and "running the same scan again resumes" in lines[0]
    kept = sorted(p.name for p in cache.glob("sensitivity/sensitivity-*.units/*.json"))
    assert kept and not list(cache.glob("sensitivity/sensitivity-*.json"))  # nothing partial as the scan
    second = HeadProcess(tmp_path)
    try:
        proc = _cli([*args, "--cluster", second.address], env)
        out, err = proc.communicate(timeout=600)
    finally:
        second.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Resuming the scan" in err
    assert not list(cache.glob("sensitivity/sensitivity-*.units"))  # the finished scan replaced its units
    # the same scan in process (same environment, nothing cached)
    here = _cli([*args, "--no-cache"], env)
    ref, err = here.communicate(timeout=600)
    assert here.returncode == 0, err[-3000:]
    from studio.core.calib.sensitivity import Sensitivity

    _same(Sensitivity.from_dict(json.loads(ref)), Sensitivity.from_dict(json.loads(out)))
