"""The budget planner and the scan consider the low-bit types llama-quantize writes (issue 24): below what
the K-quants allow, ``--budget`` and ``vram=`` plans take IQ2_XXS, IQ1_S ...; without an importance matrix
an rtn plan leaves out the types that need one."""

from __future__ import annotations

import pytest

from studio.core.calib.scan_settings import ALL_SCAN_TYPES
from studio.core.calib.sensitivity import DEFAULT_TYPES, ScanSettings
from studio.core.errors import QuantizationError
from studio.core.model import open_model
from studio.core.plan.allocate import allocate, parse_budget
from studio.core.plan.imatrix_need import LLAMA_IMATRIX_TYPES
from studio.core.plan.scan import LOW_BIT_SCAN_TYPES, TRAINED_ONLY_TYPES
from studio.core.quant.types import PLAN_TYPES, QTYPES
from tests.scan_data import synthetic_scan

# made-up KL per effective type: fewer bits, more KL
KL = {
    "IQ1_S": 0.4,
    "IQ2_XXS": 0.16,
    "IQ2_S": 0.11,
    "IQ3_XXS": 0.07,
    "Q2_K": 0.08,
    "IQ3_S": 0.04,
    "Q4_K": 0.012,
    "Q8_0": 0.0005,
}


@pytest.fixture(scope="module")
def info(llama_model):
    with open_model(llama_model) as ck:
        return ck.info


def test_every_low_bit_type_is_a_scan_candidate_and_plannable():
    written = {
        "IQ1_S",
        "IQ1_M",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ2_S",
        "IQ3_XXS",
        "IQ3_S",
        "MXFP4",
        "TQ1_0",
        "TQ2_0",
        "Q1_0",
        "Q2_0",
    }
    assert written <= set(LOW_BIT_SCAN_TYPES) <= set(ALL_SCAN_TYPES)
    # the default menu leaves out the types for weights trained for them (issue 37); they join when named
    assert set(DEFAULT_TYPES) == set(ScanSettings().types) == set(ALL_SCAN_TYPES) - set(TRAINED_ONLY_TYPES)
    assert written - set(TRAINED_ONLY_TYPES) <= set(DEFAULT_TYPES)
    assert written <= set(PLAN_TYPES) and all(QTYPES[q].plannable for q in written)


def test_a_budget_below_the_k_quants_takes_the_i_quants(info, llama_model, tmp_path):
    import numpy as np

    from studio.core.calib.imatrix import Imatrix, ImatrixEntry
    from studio.core.export.run import export_gguf
    from studio.core.gguf.layout import layout

    old = synthetic_scan(info, {q: KL[q] for q in ("Q2_K", "Q4_K", "Q8_0")})
    scan = synthetic_scan(info, KL)
    budget = parse_budget("2.4bpw")
    with pytest.raises(QuantizationError, match="below what these types allow"):
        allocate(info, old, budget)  # Q2_K is 2.625 bits per weight at least
    a = allocate(info, scan, budget, method="imatrix")
    assert a.bpw <= 2.4
    used = set(a.plan.types.values())
    assert used & {"IQ1_S", "IQ2_XXS", "IQ2_S"}, used
    # a memory budget as well: the same plan's memory is a bound the planner meets with the i-quants
    m = allocate(info, scan, parse_budget(f"vram={a.memory_bytes}", ctx_len=4096), method="imatrix")
    assert m.memory_bytes <= a.memory_bytes and set(m.plan.types.values()) & {"IQ1_S", "IQ2_XXS", "IQ2_S"}
    # the plan exports (with an importance matrix) to a file of exactly the size it was planned at
    rng = np.random.default_rng(1)
    entries = {
        t.gguf_name: ImatrixEntry(
            t.gguf_name, rng.gamma(1.0, 1.0, (1, t.n_per_row)).astype(np.float32), np.ones(1, np.float32)
        )
        for t in layout(info).tensors
        if len(t.shape) == 2
    }
    im = Imatrix(entries, datasets=("synthetic",), chunk_count=1, chunk_size=64)
    a = allocate(info, scan, budget, method="imatrix", imatrix=im)
    res = export_gguf(llama_model, tmp_path / "b.gguf", a.plan, imatrix=im)
    assert res.file_bytes == a.file_bytes
    assert {t for t in res.tensor_types.values()} >= used - {"F16"}


def test_an_rtn_plan_without_an_imatrix_leaves_out_the_types_that_need_one(info):
    scan = synthetic_scan(info, KL)
    a = allocate(info, scan, parse_budget("4bpw"), method="rtn")
    assert not set(a.plan.types.values()) & LLAMA_IMATRIX_TYPES
    with pytest.raises(QuantizationError, match="below what these types allow"):
        allocate(info, scan, parse_budget("2.4bpw"), method="rtn")


@pytest.mark.slow  # a real proxy scan (calibration, the model's runs, the lattice searches)
def test_a_real_scan_measures_the_low_bit_types_and_the_budget_uses_them(llama_model, info):
    from studio.core.calib.sensitivity import scan_sensitivity

    types = ("Q2_K", "Q4_K", "IQ2_XXS", "IQ1_S", "IQ3_S", "TQ2_0", "MXFP4")
    scan = scan_sensitivity(llama_model, settings=ScanSettings(types=types, calib_chunks=2, n_chunks=1))
    assert scan.types == types
    for t in scan.tensors:
        want = set(types) - (
            {"IQ2_XXS", "IQ1_S"} if t.gguf_name in ("token_embd.weight", "output.weight") else set()
        )
        assert set(t.by_type) == want, t.gguf_name  # no importance for the embedding: no IQ2_XXS/IQ1_S there
        assert all(c.kl >= 0 and c.bytes > 0 for c in t.by_type.values())
    a = allocate(info, scan, parse_budget("2.4bpw"), method="imatrix")
    assert a.bpw <= 2.4 and set(a.plan.types.values()) & {"IQ2_XXS", "IQ1_S"}
