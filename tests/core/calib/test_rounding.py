"""Planning with the export's rounding: one run measures plans on several texts, and the scan is corrected
by GPTQ's output error over the imatrix search's, measured on a sample of layers."""

from __future__ import annotations

import dataclasses

import pytest

from studio.core.calib.data import CalibrationText
from studio.core.calib.rounding import RoundingRatios, corrected_scan, probe_layers, rounding_ratios
from studio.core.calib.sensitivity import ScanSettings, measure_plans, measure_plans_on
from studio.core.model import open_model
from tests.scan_data import synthetic_scan

ST = ScanSettings(types=("Q4_0", "Q8_0"), n_ctx=32, n_chunks=2, calib_ctx=64, calib_chunks=2)


def _texts():
    from studio.core.factory import sample_text

    text = sample_text()
    return CalibrationText("a", text), CalibrationText("b", "\n".join(reversed(text.splitlines())))


def test_plans_on_two_texts_in_one_run_match_a_run_per_text(llama_model):
    a, b = _texts()
    with open_model(llama_model) as ck:
        names = [t.name for t in ck.info.tensors if t.name.endswith("proj.weight")]
    plans = [{n: "Q4_0" for n in names}, {n: "Q8_0" for n in names[:3]}]
    on_a, on_b = measure_plans_on(llama_model, plans, [(a, ST), (b, ST)])
    assert on_a == pytest.approx(measure_plans(llama_model, plans, a, ST), rel=1e-4)
    assert on_b == pytest.approx(measure_plans(llama_model, plans, b, ST), rel=1e-4)
    assert on_a[0] > on_a[1] > 0 and on_a != pytest.approx(on_b, rel=1e-3)  # the texts differ


def test_gptq_lowers_the_output_error_and_the_scan_follows(llama_model, tmp_path):
    a, _ = _texts()
    r = rounding_ratios(
        llama_model, a, ("Q2_K", "Q4_0", "Q8_0"), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=tmp_path
    )
    assert r.layers == (0,) and r.tokens == 256 and set(r.ratios) >= {"Q4_0", "Q8_0"}
    # GPTQ minimises the output error the imatrix search only weights: below 1 at every type, each ratio
    # the median of the sampled linears' (layer 0's seven)
    assert all(0 < v < 1.0 for v in r.ratios.values())
    assert all(len(v) == 7 for v in r.samples.values())
    assert r.ratios["Q4_0"] == pytest.approx(sorted(r.samples["Q4_0"])[3])
    # kept in the cache: the same answer without a run
    again = rounding_ratios(
        llama_model, a, ("Q2_K", "Q4_0", "Q8_0"), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=tmp_path
    )
    assert again == r and len(list(tmp_path.glob("rounding-*.json"))) == 1
    # awq+gptq (best) probes the same rounding: the measurement is shared, under its own method's name
    best = rounding_ratios(
        llama_model, a, ("Q2_K", "Q4_0", "Q8_0"), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=tmp_path,
        method="awq+gptq",
    )  # fmt: skip
    assert (
        best == dataclasses.replace(r, method="awq+gptq") and len(list(tmp_path.glob("rounding-*.json"))) == 1
    )
    with open_model(llama_model) as ck:
        scan = synthetic_scan(ck.info, {"Q4_0": 0.01, "Q8_0": 0.001})
    fixed = corrected_scan(scan, RoundingRatios("gptq", {"Q4_0": 0.5}, {}, (0,), 256))
    assert fixed.method == "gptq"
    for t0, t1 in zip(scan.tensors, fixed.tensors, strict=True):
        want = 0.5 if t0.layer is not None else 1.0  # the embedding and the head are not GPTQ-rounded
        assert t1.by_type["Q4_0"].kl == pytest.approx(t0.by_type["Q4_0"].kl * want)
        assert t1.by_type["Q8_0"] == t0.by_type["Q8_0"]


def test_the_probe_takes_the_default_scans_low_bit_candidates(llama_model, tmp_path):
    # the default scan measures the low-bit types (IQ3_S … TQ1_0) too; the probe ended with "IQ1_S has no
    # block grid", so `export --budget --method best` failed. The lattice types are rounded as the export
    # rounds them (gptq_lattice); the ternary ones keep the imatrix search's KL
    a, _ = _texts()
    r = rounding_ratios(
        llama_model, a, ("Q4_0", "IQ3_S", "TQ2_0"), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=tmp_path
    )
    assert set(r.ratios) == {"Q4_0", "IQ3_S"} and all(0 < v < 1 for v in r.ratios.values())
    with open_model(llama_model) as ck:
        scan = synthetic_scan(ck.info, {"Q4_0": 0.01, "TQ2_0": 0.02})
    fixed = corrected_scan(scan, r)
    for t0, t1 in zip(scan.tensors, fixed.tensors, strict=True):
        assert t1.by_type["TQ2_0"] == t0.by_type["TQ2_0"]  # no ratio: the imatrix search's KL, as measured


def test_probe_layers_spread_over_the_proxys_sample():
    assert probe_layers(30) == (0, 15, 29)
    assert probe_layers(2) == (0, 1)
    assert dataclasses.is_dataclass(RoundingRatios)


def test_a_scan_measures_texts_of_other_kinds_beside_the_calibration_text(llama_model, tmp_path):
    from studio.core.calib.sensitivity import scan_sensitivity

    a, b = _texts()
    st = dataclasses.replace(ST, exact=True)
    one = scan_sensitivity(llama_model, a, st, imatrix={}, cache_dir=tmp_path)
    both = scan_sensitivity(llama_model, a, st, imatrix={}, also=[b], cache_dir=tmp_path)
    assert both.n_tokens == 2 * one.n_tokens and both.dataset == "a + b" and both.key != one.key
    kl_one = {t.name: t.by_type["Q4_0"].kl for t in one.tensors}
    kl_both = {t.name: t.by_type["Q4_0"].kl for t in both.tensors}
    assert kl_both != pytest.approx(kl_one, rel=1e-3)  # the other text's chunks count


def test_the_probe_rounds_the_lattice_types_as_the_export_does(llama_model, tmp_path):
    # a budget plan with --method gptq over the low-bit candidates probes them with the vector GPTQ
    # (before: "IQ2_XS has no block grid" stopped `export --budget --method gptq --types …,IQ2_XS`)
    a, _ = _texts()
    r = rounding_ratios(
        llama_model, a, ("IQ2_XS", "IQ3_S"), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=tmp_path
    )
    assert set(r.ratios) == {"IQ2_XS", "IQ3_S"} and all(len(v) == 7 for v in r.samples.values())
    assert all(0 < v < 1.0 for v in r.ratios.values())  # GPTQ's output error below the imatrix search's


def test_the_ratios_are_judged_on_chunks_gptq_was_not_fitted_to(llama_model, tmp_path):
    # GPTQ minimises the output error on the chunks it is fitted to, so judged there it looked far better
    # than on other text (the demo: Q8_0 ×0.12 in sample, ×0.21 held out; Q6_K ×0.15 against ×0.60) and
    # the allocator trusted it; the ratios are now judged on the odd chunks, fitted on the even ones
    a, _ = _texts()
    r = rounding_ratios(
        llama_model, a, ("Q4_0", "Q8_0"), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=tmp_path
    )
    assert set(r.fitted) == set(r.ratios) == {"Q4_0", "Q8_0"}
    assert all(r.fitted[q] < r.ratios[q] for q in r.ratios)
    one = rounding_ratios(llama_model, a, ("Q4_0",), n_ctx=64, n_chunks=1, layers=(0,), cache_dir=tmp_path)
    assert one.ratios == one.fitted  # one chunk: nothing to hold out, judged in sample


def test_the_probe_rounds_one_input_at_a_time_and_lets_each_go(llama_model, monkeypatch):
    """The probe takes one input's Hessians (q/k/v, o, gate/up, down), rounds the linears that read it and
    lets them go before the next (issue 40: taken all at once, every input's fitted and judging Hessians
    sat beside the 14336-wide down_proj input's; the 8B fixture's best export peaked at 7.7 GB there). It
    judges on the held-out chunks' input rows, one float32 tensor per input, not on their n × n sums."""
    import gc
    import weakref

    from studio.core.calib import collect, rounding

    a, _ = _texts()
    taken: list[tuple[list[str], list[weakref.ref]]] = []
    sums: list[set[str]] = []  # the dtypes of the fitted sums each take read, per input
    judged: list[tuple[int, ...]] = []  # the shapes of the judging rows each take returned
    real_take = collect.ActivationCollector.take_hessians
    real_rows = rounding._HeldRows.take

    def take(self, names):
        sums.append({str(self._hess[n].xtx.dtype) for n in names if n in self._hess})
        out = real_take(self, names)
        taken.append((list(names), [weakref.ref(h) for h, _n in out.values()]))
        return out

    def rows(self, names):
        out = real_rows(self, names)
        judged.extend({id(x): (tuple(x.shape), str(x.dtype)) for x in out.values()}.values())
        return out

    alive_at_entry: list[int] = []
    real_group = rounding._Probe._round_group

    def group(self, view, sites, names):
        gc.collect()
        alive_at_entry.append(sum(1 for _n, refs in taken for r in refs if r() is not None))
        return real_group(self, view, sites, names)

    monkeypatch.setattr(collect.ActivationCollector, "take_hessians", take)
    monkeypatch.setattr(rounding._HeldRows, "take", rows)
    monkeypatch.setattr(rounding._Probe, "_round_group", group)
    rounding_ratios(llama_model, a, ("Q4_0",), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=None)
    assert [len(names) for names, _r in taken] == [3, 1, 2, 1]  # q/k/v, o, gate/up, down
    assert alive_at_entry == [0, 0, 0, 0]  # no earlier input's Hessians are held when the next is taken
    assert all(d == {"torch.float64"} for d in sums)
    with open_model(llama_model) as ck:
        cfg = ck.info.config
    h, f = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    # the odd chunks (2 of 4, 64 tokens each) as rows, one tensor per input
    assert [s for s, _d in judged] == [(128, h), (128, h), (128, h), (128, f)]
    assert {d for _s, d in judged} == {"torch.float32"}


def test_the_probe_judges_on_at_most_judge_tokens_rows(llama_model, monkeypatch):
    """The held-out rows stop at ``JUDGE_TOKENS`` per input; the ratios still come from them."""
    from studio.core.calib import rounding

    a, _ = _texts()
    seen: list[int] = []
    real_rows = rounding._HeldRows.take

    def rows(self, names):
        out = real_rows(self, names)
        seen.extend(int(x.shape[0]) for x in out.values())
        return out

    monkeypatch.setattr(rounding, "JUDGE_TOKENS", 80)
    monkeypatch.setattr(rounding._HeldRows, "take", rows)
    r = rounding_ratios(llama_model, a, ("Q4_0",), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=None)
    assert seen and set(seen) == {80} and 0 < r.ratios["Q4_0"] < 1


def test_the_probe_rounds_a_spread_sample_of_rows_and_its_ratio_holds(llama_model, monkeypatch):
    """The probe rounds ``PROBE_ROWS`` rows spread over each linear (issue 40: all 14336 rows of an 8B
    gate_proj made a budget plan with --method best take hours); the errors' ratio is a sum over rows, so
    the sample's stays near the whole's."""
    import torch

    from studio.core.calib import rounding

    picked = rounding.sample_rows(torch.arange(100.0)[:, None], 8)[:, 0].tolist()
    assert picked == [0.0, 14.0, 28.0, 42.0, 57.0, 71.0, 85.0, 99.0]  # spread, first and last included
    a, _ = _texts()
    full = rounding_ratios(llama_model, a, ("Q4_0",), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=None)
    shapes: list[tuple[int, ...]] = []
    real = rounding.gptq_quantize

    def gptq(w, *args, **kw):
        shapes.append(tuple(w.shape))
        return real(w, *args, **kw)

    monkeypatch.setattr(rounding, "gptq_quantize", gptq)
    monkeypatch.setattr(rounding, "PROBE_ROWS", 128)
    part = rounding_ratios(llama_model, a, ("Q4_0",), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=None)
    assert shapes and max(r for r, _c in shapes) == 128
    assert part.ratios["Q4_0"] != full.ratios["Q4_0"]  # other rows were rounded
    assert part.ratios["Q4_0"] == pytest.approx(full.ratios["Q4_0"], rel=0.1)


def test_the_probe_moves_the_bar_type_by_type(llama_model):
    """Each rounding of a sampled linear to a type is a step of the bar and the ETA (issue 40: at the 8B
    fixture the probe ran 38 minutes with the bar standing at "layer 1/2: chunk 2/2")."""
    from studio.core.jobs import SPAN_STEPS, JobContext

    a, _ = _texts()
    seen: list[tuple[int, str]] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append((d, m)), min_interval=0.0)
    rounding_ratios(
        llama_model, a, ("Q4_0", "Q8_0"), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=None, ctx=ctx
    )
    probe = [(d, m) for d, m in seen if "rounding probe" in m]
    assert len(probe) == 7 * 2  # seven linears of layer 0, two types each
    assert {m.split(" at ")[1].split(" ·")[0] for _d, m in probe} == {"Q4_0", "Q8_0"}
    done = [d for d, _m in probe]
    assert done == sorted(done) and 0 < done[0] < done[-1] < SPAN_STEPS  # the bar moves through the probe


def test_the_probes_run_is_checked_for_memory_with_its_hessians(llama_model, monkeypatch):
    """Every layer-wise run is refused before it starts when its estimate is above the free RAM; the probe's
    fitted Hessians are summed behind a wrapper, which the check did not see (its estimate left them out)."""
    from studio.core.calib import runner

    seen: list[bool] = []
    real = runner.estimate_calibrated

    def spy(*a, **k):
        seen.append(bool(k.get("hessian")))
        return real(*a, **k)

    monkeypatch.setattr(runner, "estimate_calibrated", spy)
    a, _ = _texts()
    rounding_ratios(llama_model, a, ("Q4_0",), n_ctx=64, n_chunks=4, layers=(0,), cache_dir=None)
    assert seen and seen[-1] is True
