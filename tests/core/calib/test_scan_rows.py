"""The scan's per-tensor rounding and its weighted error, a block of rows at a time (issue 40: the output
head of an 8B is 128,256 × 4096, and the float64 differences of all its rows were 4.2 GB)."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.calib import scan_rows
from tests.memprobe import added_peak


@pytest.mark.parametrize(
    ("shape", "qtype"), [((300, 512), "Q4_K"), ((257, 576), "Q4_0"), ((40, 256), "Q6_K")]
)
@pytest.mark.parametrize("weighted", [True, False])
def test_blocks_of_rows_give_the_bits_of_the_whole(shape, qtype, weighted, monkeypatch) -> None:
    """In blocks (forced small here, and uneven) the decoded rows are those of one call and the error is the
    same float64 number, bit for bit: numpy sums axis 0 row after row, and each block starts from the
    running sum."""
    from studio.core.quant.blocks import dequantize, quantize

    rng = np.random.default_rng(7)
    rows = rng.standard_normal(shape).astype(np.float32)
    qw = rng.random(shape[1]).astype(np.float32) if weighted else None
    whole_deq = dequantize(quantize(rows, qtype, qw), qtype, rows.shape)
    d = (rows.astype(np.float64) - whole_deq) ** 2
    col = d.sum(0)
    whole = float(col.sum()) if qw is None else float((col * qw.astype(np.float64)).sum())
    monkeypatch.setattr(scan_rows, "_BLOCK_VALUES", 37 * shape[1])  # blocks of 37 rows
    deq = scan_rows.quantize_rows(rows, qtype, qw)
    assert np.array_equal(deq, whole_deq)
    assert scan_rows.weighted_error(rows, deq, qw) == whole


_PROBE = """
import json, resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from studio.core.calib.scan_rows import weighted_error
rng = np.random.default_rng(0)
rows = rng.standard_normal((40000, 4096), dtype=np.float32)
deq = rows + np.float32(1e-3)
qw = np.ones(4096, dtype=np.float32)
weighted_error(rows[:64], deq[:64], qw)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
weighted_error(rows, deq, qw)
print(json.dumps({"added": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before}))
"""


def test_the_weighted_error_of_a_tall_matrix_holds_a_block_not_the_matrix_in_float64() -> None:
    """A 40,000 × 4096 weight (655 MB in float32): the error adds under 0.3 of it at its peak
    (one block of float64 differences, 128 MB); whole, it held the float64 differences of every row (measured 1.31 GB added)."""
    added = added_peak(_PROBE)
    assert added < 0.3 * 40000 * 4096 * 4, f"the error added {added / 1e9:.2f} GB at its peak"
