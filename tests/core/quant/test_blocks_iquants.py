"""The low-bit types of issue 24 (i-quants, ternary, MXFP4, Q1_0/Q2_0): bytes identical to ggml_quantize_chunk."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal

import gguf
import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.quant import blocks, iquants, lowbit
from studio.core.quant import reference as ref
from studio.core.quant.types import QTYPES
from tests.core.quant import blocks_data

pytestmark = pytest.mark.skipif(not ref.available(), reason="llama-cpp-python's ggml library is missing")

SCALAR = list(lowbit.LOWBIT_TYPES)
LATTICE = list(iquants.IQ_TYPES)
IMATRIX = [None, "imatrix", "imatrix_zeros"]
ROWS, COLS = 4, 512
# acceptance distributions plus all-zero blocks and one-hot outliers ("zeros", "outlier") and the hard ones
DISTS = [*blocks_data.DISTS, "ties", "signed_zeros", "subnormal"]


def make(dist: str, rows: int = ROWS, cols: int = COLS, seed: int = 0) -> np.ndarray:
    """A small float32 matrix of the named kind, with one all-zero and one one-hot block per matrix."""
    x = blocks_data.make(dist, rows, cols, seed)
    x[0, 256:512] = 0.0  # an all-zero super-block
    if rows > 1:
        x[1, 256:512] = 0.0
        x[1, 300] = -7.0  # a one-hot block
    return x


def mismatches(a: np.ndarray, b: np.ndarray, qtype: str) -> int:
    size = QTYPES[qtype].type_size
    return int((a != b).reshape(a.shape[0], -1, size).any(-1).sum())


def needs_imatrix(qtype: str) -> bool:
    return qtype in iquants.NEEDS_IMATRIX


def quantize(x: np.ndarray, qtype: str, qw: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """blocks.quantize (Q2_0 too, registered from studio.core.ggml_types where gguf-py cannot name it)."""
    return blocks.quantize(x, qtype, qw, threads=threads)


def dequantize(q: np.ndarray, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    return blocks.dequantize(q, qtype, shape)


def _cases(types: list[str]) -> list[tuple[str, str | None]]:
    return [(t, im) for t in types for im in IMATRIX if im is not None or not needs_imatrix(t)]


def test_registry_knows_the_new_types() -> None:
    for qtype in SCALAR + LATTICE:
        info = QTYPES[qtype]
        assert (info.block_size, info.type_size) == (
            ref._block_size(ref.type_id(qtype)),
            ref.ggml_row_size(qtype, info.block_size),
        )
        assert (
            info.needs_imatrix
            == needs_imatrix(qtype)
            == bool(ref._lib().ggml_quantize_requires_imatrix(ref.type_id(qtype)))
        )
    assert QTYPES["IQ2_XXS"].fallback == "IQ4_NL" and QTYPES["TQ1_0"].fallback == "Q4_0"
    assert abs(QTYPES["IQ2_XXS"].bits_per_weight - 2.0625) < 1e-9 and QTYPES["IQ3_S"].ftype == 26


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize(("qtype", "im"), _cases(SCALAR + LATTICE), ids=lambda v: v or "no_imatrix")
def test_bytes_equal_llama_cpp(qtype: str, im: str | None, dist: str) -> None:
    x = make(dist)
    qw = blocks_data.imatrix_for(im, COLS)
    theirs = ref.ggml_quantize(x, qtype, qw)
    ours = quantize(x, qtype, qw)
    assert ours.shape == theirs.shape == (ROWS, ref.ggml_row_size(qtype, COLS))
    assert mismatches(ours, theirs, qtype) == 0


@pytest.mark.parametrize(("qtype", "im"), _cases(SCALAR + LATTICE), ids=lambda v: v or "no_imatrix")
def test_random_scales_equal_llama_cpp(qtype: str, im: str | None) -> None:
    # Rows over 20 orders of magnitude, some all positive, some all negative.
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((12, 256)) * 10.0 ** rng.uniform(-10, 4, (12, 1))).astype(np.float32)
    x[::5] = np.abs(x[::5])
    x[1::5] = -np.abs(x[1::5])
    qw = blocks_data.imatrix_for(im, 256)
    assert mismatches(quantize(x, qtype, qw), ref.ggml_quantize(x, qtype, qw), qtype) == 0


@pytest.mark.parametrize("qtype", SCALAR)
def test_scalar_types_beyond_fp16_equal_llama_cpp(qtype: str) -> None:
    """Values beyond fp16 (and near float32's limits) in the scalar types, whose kernels never abort."""
    x = make("beyond_fp16")
    x[2, :32] = np.float32(3.0e38)
    x[3, :64] = np.float32(1.0e-39)  # a subnormal block: 1/amax overflows to inf
    assert mismatches(quantize(x, qtype), ref.ggml_quantize(x, qtype), qtype) == 0


def ggml_in_child(x: np.ndarray, qtype: str, qw: np.ndarray | None) -> np.ndarray | None:
    """ggml's bytes computed in a child process; None when ggml aborted there."""
    # Not "fork": once an earlier test ran an OpenMP region here (ggml's CPU code, torch), the forked
    # child's copy of libgomp waits forever for the parent's pool threads in iq2xs_init_impl's
    # GOMP_parallel. The fork server is a fresh process that imports this module once.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, x, qtype, qw))
    proc.start()
    child.close()
    try:
        out = parent.recv() if parent.poll(300) else None
    except EOFError:  # the child died without sending
        out = None
    proc.join(60)
    if proc.exitcode == -signal.SIGABRT:  # GGML_ASSERT / GGML_ABORT
        return None
    assert proc.exitcode == 0 and out is not None, (
        f"the ggml child failed otherwise (exit code {proc.exitcode})"
    )
    return out


def _child(conn, x, qtype, qw) -> None:  # pragma: no cover - runs in the child
    os.environ["GGML_NO_BACKTRACE"] = "1"  # ggml would attach gdb to print one
    faulthandler.disable()  # the abort is expected: no Python crash report
    conn.send(ref.ggml_quantize(x, qtype, qw))
    conn.close()


@pytest.mark.parametrize(("qtype", "im"), _cases(LATTICE), ids=lambda v: v or "no_imatrix")
def test_lattice_types_beyond_fp16_match_or_refuse_where_ggml_aborts(qtype: str, im: str | None) -> None:
    """Squares overflowing float32: where ggml aborts the process the studio refuses; elsewhere same bytes."""
    x = make("beyond_fp16")[:2]
    qw = blocks_data.imatrix_for(im, COLS)
    theirs = ggml_in_child(x, qtype, qw)
    if theirs is None:
        with pytest.raises(QuantizationError, match="abort"):
            quantize(x, qtype, qw)
    else:
        assert mismatches(quantize(x, qtype, qw), theirs, qtype) == 0


def test_mxfp4_exponent_near_powers_of_two() -> None:
    """floorf(log2f(amax)) decides the shared exponent: amax just below, at and above each power of two."""
    p = 2.0 ** np.arange(-140, 127, 3, dtype=np.float64)
    amax = np.concatenate(
        [
            np.nextafter(p.astype(np.float32), 0),
            p.astype(np.float32),
            np.nextafter(p.astype(np.float32), np.inf),
        ]
    )
    x = np.zeros((amax.size, 32), np.float32)
    x[:, 0] = amax
    x[:, 1:] = amax[:, None] * np.linspace(-0.9, 0.9, 31, dtype=np.float32)
    assert mismatches(blocks.quantize(x, "MXFP4", threads=1), ref.ggml_quantize(x, "MXFP4"), "MXFP4") == 0


@pytest.mark.parametrize("qtype", SCALAR + LATTICE)
def test_dequantize_equals_gguf_py(qtype: str) -> None:
    x = make("gauss")
    qw = blocks_data.imatrix_for("imatrix", COLS)
    q = quantize(x, qtype, qw)
    ours = dequantize(q, qtype, x.shape)
    theirs = ref.ggml_dequantize(q, qtype, x.shape)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    if (
        qtype in gguf.GGMLQuantizationType.__members__
        and gguf.GGMLQuantizationType[qtype] in gguf.quants._type_traits
    ):
        gg = gguf.quants.dequantize(q, gguf.GGMLQuantizationType[qtype]).astype(np.float32)
        np.testing.assert_array_equal(ours.view(np.uint32), gg.reshape(x.shape).view(np.uint32))
    # a real reconstruction, not a constant
    err = float(np.abs(ours[2:] - x[2:]).mean())
    assert err < 0.9 * float(np.abs(x[2:]).mean()), err


@pytest.mark.parametrize("qtype", [t for t in LATTICE if QTYPES[t].needs_imatrix])
def test_types_needing_an_imatrix_are_refused_before_any_work(qtype: str) -> None:
    assert ref.ggml_quantize  # ggml asserts (aborts the process) here; the studio refuses in one sentence
    with pytest.raises(iquants.ImatrixRequiredError) as err:
        blocks.quantize(np.full((2, 256), np.nan, np.float32), qtype)  # refused before the NaN scan
    msg = str(err.value)
    assert qtype in msg and "importance matrix" in msg and "calibrate" in msg
    assert msg.count(". ") == 0 and msg.endswith(".")
    with pytest.raises(iquants.ImatrixRequiredError, match="calibrate"):
        iquants.quantize_rows(np.zeros((1, 256), np.float32), qtype)


def test_threads_give_the_same_bytes() -> None:
    x = make("student_t3", rows=16, cols=512, seed=5)
    qw = blocks_data.imatrix_for("imatrix", 512)
    want = ref.ggml_quantize(x, "IQ3_S", qw)
    np.testing.assert_array_equal(blocks.quantize(x, "IQ3_S", qw, threads=4), want)


def test_neighbour_tables_match_ggml_structure() -> None:
    """Every packed point is on the grid or has a non-empty, sorted-by-distance neighbour list."""
    for qtype in LATTICE:
        grid, kmap, neigh = iquants.grid_tables(qtype)
        dim = grid.shape[1]
        bits = 2 if dim == 8 else 3
        on = kmap >= 0
        assert on.sum() == grid.shape[0]
        for i in np.flatnonzero(~on)[:: max(1, (~on).sum() // 200)]:
            start = -int(kmap[i]) - 1
            n = int(neigh[start])
            assert n > 0
            pos = 2 * ((i >> (bits * np.arange(dim))) & ((1 << bits) - 1)) + 1
            d2 = ((grid[neigh[start + 1 : start + 1 + n]].astype(int) - pos) ** 2).sum(1)
            assert (np.diff(d2) >= 0).all()
            assert d2[0] == ((grid.astype(int) - pos) ** 2).sum(1).min()
