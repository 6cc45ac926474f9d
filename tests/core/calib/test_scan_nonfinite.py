"""No non-finite number flows on: a NaN in one candidate of a scan marks that candidate unusable, never its
tensor's other candidates, and the allocator, the predicted KL, the judge and the cache refuse it (issue 37)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from studio.core.calib import scan_rows, scan_streams
from studio.core.calib.heldout import PresetPoint, check_judged
from studio.core.calib.scan_cache import load_cached_scan, save_cached_scan
from studio.core.calib.scan_proxy import gain_type
from studio.core.calib.sensitivity import ScanSettings, scan_sensitivity
from studio.core.errors import CalibrationError, QuantizationError
from studio.core.model import open_model
from studio.core.plan.allocate import allocate, parse_budget
from studio.core.plan.scan import scan_targets
from tests.core.calib.test_sensitivity import SETTINGS, _imatrix
from tests.scan_data import synthetic_scan


def _planted(monkeypatch, tensor: str, qtype: str) -> None:
    """Make the scan's quantized weights of ``tensor`` at ``qtype`` NaN (every other pair as before)."""
    real = scan_rows.quantized_blocks
    cur: dict[str, str] = {}

    def named(orig):
        def method(self, name, rows, q, *rest):
            cur["name"] = name
            return orig(self, name, rows, q, *rest)

        return method

    def blocks_nan(rows, q, qw):
        for i, (b, deq) in enumerate(real(rows, q, qw)):
            if i == 0 and cur.get("name") == tensor and q == qtype:
                deq = deq.copy()
                deq[0, 0] = np.nan
            yield b, deq

    for method in ("_quantized", "_head_difference"):  # the whole candidate, or a head's rows block by block
        monkeypatch.setattr(
            scan_streams.SensitivityScan, method, named(getattr(scan_streams.SensitivityScan, method))
        )
    monkeypatch.setattr(scan_rows, "quantized_blocks", blocks_nan)
    monkeypatch.setattr(scan_streams, "quantized_blocks", blocks_nan)


def test_a_nan_in_one_candidate_leaves_the_rest_of_the_plan_unchanged(llama_model, calib_text, monkeypatch):
    im = _imatrix(llama_model, calib_text)
    clean = scan_sensitivity(llama_model, calib_text, SETTINGS, imatrix=im)
    with open_model(llama_model) as ck:
        info = ck.info
    budget = parse_budget("5bpw")
    base = allocate(info, clean, budget)
    # a tensor the clean plan does not give its smallest type: a NaN taken as a free cost would win there
    target = next(
        t
        for t in clean.tensors
        if base.plan.types[t.name] != min(t.by_type.values(), key=lambda c: c.bytes).effective
    )
    small = min(target.by_type.values(), key=lambda c: c.bytes)
    _planted(monkeypatch, target.name, small.effective)
    bad = scan_sensitivity(llama_model, calib_text, SETTINGS, imatrix=im)

    hit = bad.tensor(target.name)
    for q, c in hit.by_type.items():
        if c.effective == small.effective:
            assert not c.usable and "not finite" in c.unusable
        else:  # the tensor's other candidates are measured as before
            assert c.usable and c.kl == pytest.approx(clean.tensor(target.name).cost(q).kl, rel=1e-6)
    for t in bad.tensors:
        if t.name != target.name:
            for q, c in t.by_type.items():
                assert c.usable and c.kl == pytest.approx(clean.tensor(t.name).cost(q).kl, rel=1e-6)
    a = allocate(info, bad, budget)
    assert a.plan.types == base.plan.types
    assert math.isfinite(a.predicted_kl) and a.predicted_kl == pytest.approx(base.predicted_kl, rel=1e-9)


def test_a_nan_in_the_proxys_reference_candidate_does_not_spread(tiny_model, calib_text, monkeypatch):
    # the proxy predicts every other candidate as gain × error, the gain from the reference candidate:
    # a NaN there made all of the tensor's candidates NaN (the demo's tied embedding at Q2_0)
    model = tiny_model("llama", layers=6, hidden=128)
    im = _imatrix(model, calib_text)
    st = dataclasses.replace(SETTINGS, exact=False, types=("Q4_0", "Q2_K", "Q8_0"))
    name = "model.layers.0.mlp.down_proj.weight"
    with open_model(model) as ck:
        ref = gain_type(next(t for t in scan_targets(ck.info, st.types)[0] if t.name == name))
    _planted(monkeypatch, name, ref)
    proxy = scan_sensitivity(model, calib_text, st, imatrix=im)
    t = proxy.tensor(name)
    bad = [c for c in t.by_type.values() if c.effective == ref]
    assert bad and all(c.measured and not c.usable for c in bad)
    others = [c for c in t.by_type.values() if c.effective != ref]
    assert others and all(c.usable and math.isfinite(c.kl) and c.kl > 0 for c in others)
    assert proxy.non_finite() is None
    for u in proxy.tensors:
        if u.name != name:
            assert all(c.usable and math.isfinite(c.kl) for c in u.by_type.values())


def test_an_exp_overflow_is_measured_again_in_float64_not_turned_into_nan():
    # the scan's head passes its own scratch δ (owned): the float64 repeat must not read the δ the float32
    # pass already overwrote with exp(δ) − 1 (on main it read inf and returned NaN)
    from studio.core.calib.scan_kl import _kl_float64, kl_from_delta

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(8, 512, generator=g, dtype=torch.float64), -1)
    delta = 30 * torch.randn(8, 512, generator=g)  # exp(δ) beyond float32's range
    want = _kl_float64(p, delta)
    assert math.isfinite(want) and want > 1
    assert kl_from_delta(p.float(), delta.clone(), owned=True) == pytest.approx(want, rel=1e-6)
    assert math.isnan(kl_from_delta(p.float(), torch.full((8, 512), float("nan"))))


def _with_nan(info):
    scan = synthetic_scan(info, {"Q4_0": 0.02, "Q8_0": 0.0005})
    t = scan.tensors[1]
    c = dataclasses.replace(t.by_type["Q4_0"], kl=float("nan"))
    bad = dataclasses.replace(t, by_type={**t.by_type, "Q4_0": c})
    return dataclasses.replace(scan, tensors=(scan.tensors[0], bad, *scan.tensors[2:])), t


def test_the_allocator_and_the_sum_refuse_a_nan_naming_tensor_and_type(llama_model):
    with open_model(llama_model) as ck:
        info = ck.info
    scan, t = _with_nan(info)
    with pytest.raises(QuantizationError, match=rf"{t.name} at Q4_0"):
        allocate(info, scan, parse_budget("5bpw"))
    with pytest.raises(QuantizationError, match=rf"{t.name} at Q4_0"):
        scan.predicted_kl({t.name: "Q4_0"})
    # marked unusable instead, it is left out and the plan is made from the rest
    c = dataclasses.replace(scan.tensors[1].by_type["Q4_0"], unusable="its KL is not finite")
    marked = dataclasses.replace(scan.tensors[1], by_type={**scan.tensors[1].by_type, "Q4_0": c})
    ok = dataclasses.replace(scan, tensors=(scan.tensors[0], marked, *scan.tensors[2:]))
    a = allocate(info, ok, parse_budget("6bpw"))
    assert a.plan.types[t.name] != "Q4_0" and math.isfinite(a.predicted_kl)


def test_a_cached_scan_with_a_nan_is_not_reused(llama_model, tmp_path):
    with open_model(llama_model) as ck:
        info = ck.info
    good = synthetic_scan(info, {"Q4_0": 0.02, "Q8_0": 0.0005})
    save_cached_scan(tmp_path, "good", good)
    assert load_cached_scan(tmp_path, "good") is not None
    scan, _ = _with_nan(info)
    save_cached_scan(tmp_path, "bad", scan)
    assert (tmp_path / "sensitivity-bad.json").exists()
    assert load_cached_scan(tmp_path, "bad") is None


def test_the_judge_refuses_a_nan():
    with pytest.raises(CalibrationError, match="held-out"):
        check_judged(float("nan"), None)
    with pytest.raises(CalibrationError, match="IQ3_XXS"):
        check_judged(0.1, PresetPoint("IQ3_XXS", 1, float("nan"), {}))
    check_judged(0.1, PresetPoint("IQ3_XXS", 1, 0.2, {}))


def test_named_trained_only_types_keep_the_guarantees(tiny_model, calib_text):
    # a float model scanned with Q2_0 and the ternary types named: every candidate finite or marked, the
    # tied embedding's Q2_0 measured (not NaN), and the edge guard keeps it at least at the preset's type
    from studio.core.calib import calibrate, imatrix_from_stats
    from studio.core.calib.heldout import guard_edges
    from studio.core.calib.sensitivity import scan_sensitivity
    from studio.core.model import open_model
    from studio.core.plan.allocate import allocate, parse_budget

    model = tiny_model("llama", tie_embeddings=True, layers=4, hidden=256)
    stats = calibrate(model, calib_text, n_ctx=64, n_chunks=4, device="cpu", dtype="float32", histogram=False)
    with open_model(model) as ck:
        info = ck.info
        im = imatrix_from_stats(stats, info)
    st = ScanSettings(
        types=("Q2_0", "Q1_0", "TQ1_0", "TQ2_0", "Q4_0", "Q8_0"),  # all four trained-only types named
        exact=False,
        n_ctx=32,
        n_chunks=2,
        calib_ctx=64,
        calib_chunks=4,
    )
    scan = scan_sensitivity(model, calib_text, st, imatrix=im)
    assert scan.non_finite() is None
    emb = next(t for t in scan.tensors if t.gguf_name == "token_embd.weight")
    assert math.isfinite(emb.cost("Q2_0").kl) and emb.cost("Q2_0").usable
    # the proxy's reference for the embedding is not the trained-only type: Q4_0 is measured exactly
    assert emb.cost("Q4_0").measured
    guarded = guard_edges(scan, {emb.name: "Q8_0"})
    a = allocate(info, guarded, parse_budget("4.5bpw"))
    assert a.plan.types[emb.name] == "Q8_0" and math.isfinite(a.predicted_kl)


def test_a_cached_imatrix_with_a_nan_is_not_reused(tmp_path):
    # the scan's other cache: an imatrix holding a NaN (written by an older run) is calibrated again, never used
    from studio.core.calib.imatrix import Imatrix, ImatrixEntry, write_imatrix
    from studio.core.calib.scan_cache import cached_imatrix

    def imatrix(value: float) -> Imatrix:
        sums = np.array([[1.0, value, 2.0, 3.0]], np.float32)
        e = ImatrixEntry("blk.0.attn_q.weight", sums, np.array([4.0], np.float32))
        return Imatrix({e.name: e}, ("text",), 1, 4)

    write_imatrix(imatrix(0.5), tmp_path / "good.gguf")
    assert cached_imatrix(tmp_path / "good.gguf") is not None
    write_imatrix(imatrix(float("nan")), tmp_path / "bad.gguf")
    assert (tmp_path / "bad.gguf").is_file() and cached_imatrix(tmp_path / "bad.gguf") is None
