"""Budget plans: budgets parse, the knapsack is optimal on small cases, files meet the budget to the byte."""

from __future__ import annotations

import itertools

import pytest

from studio.core.calib.sensitivity import Sensitivity, TypeCost
from studio.core.errors import CalibrationError, QuantizationError
from studio.core.model import open_model
from studio.core.plan.allocate import (
    BudgetKind,
    Choice,
    allocate,
    check_budget,
    hull,
    pareto_front,
    parse_budget,
    solve,
)
from tests.scan_data import synthetic_scan

TYPES = ("Q2_K", "Q4_0", "Q4_K", "Q5_1", "Q8_0")
# a synthetic sensitivity per qtype: fewer bits, more KL (scaled per tensor below)
KL = {"Q2_K": 0.08, "Q4_0": 0.02, "Q4_K": 0.012, "Q5_K": 0.005, "Q5_1": 0.004, "Q8_0": 0.0005}


@pytest.fixture(scope="module")
def info(llama_model):
    with open_model(llama_model) as ck:
        return ck.info


def test_budgets_parse():
    assert parse_budget("105454336").value == 105454336 and parse_budget("105454336").kind is BudgetKind.FILE
    assert parse_budget("4.5GB").value == 4.5e9
    assert parse_budget("800MiB").value == 800 * 2**20
    b = parse_budget("4.8bpw")
    assert b.kind is BudgetKind.BPW and b.value == 4.8
    m = parse_budget("vram=8GB", ctx_len=2048)
    assert m.kind is BudgetKind.MEMORY and m.value == 8e9 and m.ctx_len == 2048
    for bad, msg in [
        ("4.5 parsecs", "not a size"),
        ("-3GB", "not a size"),
        ("0", "not a positive"),
        ("xbpw", "bits"),
    ]:
        with pytest.raises(QuantizationError, match=msg):
            parse_budget(bad)


def test_hull_drops_dominated_and_concave_choices():
    cs = [
        Choice("a", 10, 1.0),
        Choice("b", 20, 0.9),
        Choice("c", 30, 0.2),
        Choice("d", 40, 0.3),
        Choice("e", 50, 0.0),
    ]
    # b lies above the segment a→c, d costs more than c for more KL
    assert [c.qtype for c in hull(cs)] == ["a", "c", "e"]


def test_solve_matches_brute_force_on_small_instances():
    import random

    rng = random.Random(5)
    for _ in range(40):
        items = []
        for _ in range(4):
            sizes = sorted(rng.sample(range(1, 40), 4))
            kls = sorted((rng.random() for _ in sizes), reverse=True)
            items.append([Choice(f"q{j}", s, k) for j, (s, k) in enumerate(zip(sizes, kls, strict=True))])
        limit = rng.randint(sum(i[0].bytes for i in items), sum(i[-1].bytes for i in items))
        got = solve(items, limit)
        assert got is not None and sum(c.bytes for c in got) <= limit
        best = min(
            sum(c.kl for c in combo)
            for combo in itertools.product(*items)
            if sum(c.bytes for c in combo) <= limit
        )
        # the Lagrangian greedy is within one item's largest step of the optimum, and usually on it
        worst_step = max(max(c.kl for c in i) - min(c.kl for c in i) for i in items)
        assert sum(c.kl for c in got) <= best + worst_step
    assert solve([[Choice("x", 10, 1.0)]], 9) is None


def test_a_file_budget_is_met_to_the_byte(info, llama_model, tmp_path):
    from studio.core.export.run import export_gguf

    scan = synthetic_scan(info, {q: KL[q] for q in TYPES})
    front = pareto_front(info, scan)
    assert len(front) >= 10 and all(a.kl >= b.kl for a, b in itertools.pairwise(front))
    lo, hi = front[0].file_bytes, front[-1].file_bytes
    for k, frac in enumerate((0.3, 0.7)):
        budget = parse_budget(str(int(lo + frac * (hi - lo))))
        a = allocate(info, scan, budget)
        assert a.file_bytes <= budget.value and a.file_bytes > budget.value - 0.1 * (hi - lo)
        assert a.predicted_kl == pytest.approx(scan.predicted_kl(a.plan.types))
        res = export_gguf(llama_model, tmp_path / f"b{k}.gguf", a.plan)
        assert (tmp_path / f"b{k}.gguf").stat().st_size == a.file_bytes == res.file_bytes
        assert {q for q in a.plan.types.values()} > {"F32"}  # a real mixture, not all one type
    # a bigger budget never predicts more KL
    a1 = allocate(info, scan, parse_budget(str(int(lo + 0.3 * (hi - lo)))))
    a2 = allocate(info, scan, parse_budget(str(int(lo + 0.7 * (hi - lo)))))
    assert a2.predicted_kl < a1.predicted_kl


def test_bpw_and_memory_budgets(info):
    scan = synthetic_scan(info, {q: KL[q] for q in TYPES})
    a = allocate(info, scan, parse_budget("5bpw"))
    assert a.bpw <= 5.0 and a.bpw > 4.0
    m = allocate(info, scan, parse_budget(f"vram={a.memory_bytes}", ctx_len=4096))
    assert m.memory_bytes <= a.memory_bytes and m.predicted_kl == pytest.approx(a.predicted_kl, rel=0.2)


def test_too_small_and_above_f16(info):
    scan = synthetic_scan(info, {q: KL[q] for q in TYPES})
    with pytest.raises(QuantizationError, match=r"below what these types allow .* the smallest plan needs"):
        allocate(info, scan, parse_budget("100kB"))
    with pytest.raises(QuantizationError, match="the smallest plan needs"):
        check_budget(info, parse_budget("100kB"), TYPES)  # the same refusal from the sizes alone
    early = check_budget(info, parse_budget("50MB"), TYPES)  # above F16: the answer needs no scan
    a = allocate(info, scan, parse_budget("50MB"))
    assert "above the F16 file" in a.notes[0] and a.predicted_kl == 0
    assert early is not None and early.notes == a.notes and dict(early.plan.types) == dict(a.plan.types)
    assert early.file_bytes == a.file_bytes
    assert check_budget(info, parse_budget(str(int(0.6 * a.file_bytes))), TYPES) is None  # needs the scan
    quantizable = [t.name for t in scan.tensors]
    assert all(a.plan.types[n] == "F16" for n in quantizable)


def test_exclude_removes_a_type_that_is_another_ones_fallback(tiny_model):
    # hidden 96: Q5_K falls back to Q5_1 on rows of 96; excluding Q5_1 must not let it in as Q5_K's fallback
    with open_model(tiny_model("llama", hidden=96, intermediate=256)) as ck:
        small = ck.info
    types = ("Q4_0", "Q5_K", "Q5_1", "Q8_0")
    scan = synthetic_scan(small, {q: KL[q] for q in types})
    big = allocate(small, scan, parse_budget("7bpw"))
    assert "Q5_1" in big.plan.types.values()  # it would be chosen
    a = allocate(small, scan, parse_budget("7bpw"), candidates=("Q4_0", "Q5_K", "Q8_0"), exclude=("Q5_1",))
    assert "Q5_1" not in a.plan.types.values()


def test_scan_json_round_trips_the_allocator_inputs(info):
    scan = synthetic_scan(info, {q: KL[q] for q in TYPES})
    again = Sensitivity.from_dict(scan.to_dict())
    b = parse_budget("4.5bpw")
    assert allocate(info, again, b).plan.types == allocate(info, scan, b).plan.types
    assert isinstance(next(iter(scan.tensors[0].by_type.values())), TypeCost)


def test_every_point_of_the_front_is_a_budget_allocate_accepts_the_smallest_included(info):
    # the slider puts a point's byte count in the budget field: at the left end too it must plan, not
    # refuse ("below what these types allow: the smallest plan needs …"), with or without an imatrix
    # (its metadata is in the file) and with the plan's method in its recipe
    from studio.core.calib.imatrix import Imatrix

    scan = synthetic_scan(info, {q: KL[q] for q in TYPES})
    im = Imatrix({}, datasets=("a calibration text.txt",), chunk_count=12, chunk_size=512, path="x.imatrix")
    for imatrix, method in ((None, None), (im, "imatrix")):
        front = pareto_front(info, scan, imatrix=imatrix, method=method)
        for point in (front[0], front[1], front[-1]):
            a = allocate(info, scan, parse_budget(str(point.file_bytes)), imatrix=imatrix, method=method)
            assert a.file_bytes == point.file_bytes and a.predicted_kl == pytest.approx(point.kl)
        with pytest.raises(QuantizationError, match="smallest plan needs"):
            allocate(info, scan, parse_budget(str(front[0].file_bytes - 1)), imatrix=imatrix, method=method)


@pytest.mark.parametrize(
    ("where", "value"),
    [("bytes", 10**400), ("bytes", -1), ("params", 2**64), ("layer", 10**9), ("tokens", -5)],
    ids=["bytes-huge", "bytes-negative", "params-2^64", "layer-1e9", "tokens-negative"],
)
def test_a_scan_file_with_counts_out_of_range_is_one_sentence(info, where, value):
    # issue 39: every number read from a file passes a range check (a byte count of 10^400 reached the
    # allocator's float sums as an OverflowError traceback)
    d = synthetic_scan(info, {q: KL[q] for q in TYPES}).to_dict()
    t = d["tensors"][0]
    if where == "bytes":
        next(iter(t["by_type"].values()))["bytes"] = value
    elif where == "tokens":
        d["tokens"] = value
    else:
        t[where] = value
    with pytest.raises(
        CalibrationError, match=r"^This is not a sensitivity scan of Quant Studio \(.* is outside 0\.\."
    ):
        Sensitivity.from_dict(d)
