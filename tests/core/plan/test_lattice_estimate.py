"""GPTQ onto an i-quant lattice costs per weight: the time estimates count it (issue 38, "Know before you start").

The 1.5B bench model's IQ3_XXS preset took 47 min with ``--method gptq`` where the estimate, which
counted only the block grids' rows × cols² products, said 15; its Q3_K_M took the 15. The estimates of a
calibrated export, of a budget's GPTQ probe and of its export now add each lattice weight's sweep.
"""

from __future__ import annotations

import dataclasses

import pytest

from studio.cli import main
from studio.core.calib import budget_job
from studio.core.calib.scan_settings import ScanSettings, default_types
from studio.core.model import open_model
from studio.core.plan import job_estimate
from studio.core.plan.allocate import parse_budget
from studio.core.plan.gguf_file import export_file_bytes
from studio.core.plan.job_estimate import (
    LATTICE_SECONDS,
    calibration_estimate_line,
    estimate_calibrated,
    lattice_seconds,
    lattice_weights,
)
from studio.core.plan.plan import plan_from_preset
from studio.core.quant.gptq_lattice import LATTICE_TYPES


@pytest.fixture
def info(llama_model):
    with open_model(llama_model) as ck:
        return ck.info


def test_every_lattice_type_has_a_measured_cost():
    assert set(LATTICE_SECONDS) == set(LATTICE_TYPES)
    assert all(0 < s < 1e-4 for s in LATTICE_SECONDS.values()), LATTICE_SECONDS
    # the 1-bit lattices search most, the 3-bit ones least (bench/gptq.py --lattice T)
    assert LATTICE_SECONDS["IQ1_S"] > LATTICE_SECONDS["IQ3_XXS"]


def test_lattice_weights_count_what_gptq_rounds_onto_a_lattice(info):
    types = dict(plan_from_preset(info, "IQ2_M", imatrix=True).types)
    got = lattice_weights(info, types, lambda _name: True)
    by_name = {t.name: t for t in info.tensors}
    want: dict[str, int] = {}
    for name, q in types.items():
        if q in LATTICE_TYPES and by_name[name].role.value != "token_embd":
            want[q] = want.get(q, 0) + by_name[name].n_elements
    assert got == want and sum(got.values()) > 0
    embd = next(t.name for t in info.tensors if t.role.value == "token_embd")
    assert lattice_weights(info, {**types, embd: "IQ2_S"}, lambda _name: True) == want  # never GPTQ-rounded
    assert lattice_weights(info, types, lambda _name: False) == {}  # the imatrix search: no sweep
    # a GGUF original's tensor already stored in its planned type is copied, not rounded
    q_name, q_type = next((n, q) for n, q in types.items() if q in LATTICE_TYPES and n != embd)
    stored = dataclasses.replace(
        info,
        tensors=tuple(dataclasses.replace(t, dtype=q_type) if t.name == q_name else t for t in info.tensors),
    )
    less = lattice_weights(stored, types, lambda _name: True)
    assert sum(less.values()) == sum(want.values()) - by_name[q_name].n_elements


def test_the_calibrated_estimate_adds_the_sweeps(info):
    cfg = dict(info.config)
    lattice = {"IQ2_S": 10_000_000, "IQ3_XXS": 5_000_000}
    base = estimate_calibrated(cfg, 512, 8, hessian=True, head=True)
    more = estimate_calibrated(cfg, 512, 8, hessian=True, head=True, lattice=lattice)
    extra = 10_000_000 * LATTICE_SECONDS["IQ2_S"] + 5_000_000 * LATTICE_SECONDS["IQ3_XXS"]
    assert lattice_seconds(lattice) == pytest.approx(extra)
    assert more.seconds == pytest.approx(base.seconds + extra) and more.peak_bytes == base.peak_bytes
    # activation statistics only (imatrix, awq's scales): no GPTQ sweep
    assert estimate_calibrated(
        cfg, 512, 8, hessian=False, head=False, lattice=lattice
    ).seconds == pytest.approx(estimate_calibrated(cfg, 512, 8, hessian=False, head=False).seconds)


def test_export_says_the_lattice_time_before_it_starts(llama_model, info, tmp_path, capsys, monkeypatch):
    # the tiny model's sweeps take milliseconds: a cost of 0.1 ms a weight makes them visible in the line
    for q in LATTICE_TYPES:
        monkeypatch.setitem(job_estimate.LATTICE_SECONDS, q, 1e-4)
    out = tmp_path / "m.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--calib-ctx", "32", "--calib-chunks", "8"]
    assert main([*argv, "--preset", "IQ2_M", "--method", "gptq"]) == 0
    first = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("Calibrating"))
    types = dict(plan_from_preset(info, "IQ2_M", imatrix=True).types)
    lattice = lattice_weights(info, types, lambda _name: True)
    assert first == calibration_estimate_line(dict(info.config), "gptq", 32, 8, "cpu", lattice=lattice)
    assert first != calibration_estimate_line(dict(info.config), "gptq", 32, 8, "cpu")


def test_a_budgets_probe_and_export_count_the_sweeps(info, monkeypatch):
    st = ScanSettings(types=default_types(info.config), n_ctx=32, calib_ctx=64, calib_chunks=4)
    assert any(q in LATTICE_TYPES for q in st.types)

    def steps(**kw):
        job = budget_job.budget_job(info, "gptq", calib_ctx=64, calib_chunks=4, settings=st, **kw)
        return dict(job.steps)

    before = steps()
    for q in LATTICE_TYPES:
        monkeypatch.setitem(job_estimate.LATTICE_SECONDS, q, 2 * LATTICE_SECONDS[q])
    after = steps()
    assert after["GPTQ's probe"].seconds > before["GPTQ's probe"].seconds  # every lattice type is probed
    assert after["the export"].seconds == pytest.approx(before["the export"].seconds)  # no plan guessed
    small = budget_job.same_size_types(info, parse_budget(str(_preset_bytes(info, "IQ2_M"))))
    assert small == dict(plan_from_preset(info, "IQ2_M", imatrix=True).types)  # the plan's likely types
    guessed = steps(plan_guess=small)
    sweep = lattice_seconds(lattice_weights(info, small, lambda _name: True))
    assert sweep > 0
    assert guessed["the export"].seconds == pytest.approx(after["the export"].seconds + sweep)
    assert budget_job.same_size_types(info, parse_budget("4bpw")) is None  # not a file size: no guess


def _preset_bytes(info, preset):
    return export_file_bytes(info, plan_from_preset(info, preset, imatrix=True))
