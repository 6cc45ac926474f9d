"""K-quants (Q2_K..Q6_K): bytes identical to llama.cpp's ggml_quantize_chunk, on numpy and torch."""

from __future__ import annotations

import threading

import gguf
import numpy as np
import pytest
import torch

from studio.core.errors import QuantizationError
from studio.core.quant import kquants, kquants_torch
from studio.core.quant import reference as ref
from studio.core.quant.types import QTYPES
from tests.core.quant import blocks_data

pytestmark = pytest.mark.skipif(not ref.available(), reason="llama-cpp-python's ggml library is missing")

TYPES = ["Q6_K", "Q4_K", "Q5_K", "Q3_K", "Q2_K"]
DISTS = blocks_data.DISTS
IMATRIX = [None, "imatrix", "imatrix_zeros"]
ROWS, COLS = 6, 768


def make(dist: str, rows: int = ROWS, cols: int = COLS, seed: int = 0) -> np.ndarray:
    """A small float32 matrix of the named kind."""
    return blocks_data.make(dist, rows, cols, seed)


def imatrix_for(kind: str | None, cols: int = COLS) -> np.ndarray | None:
    """None, a random positive importance matrix, or one with many exact zeros."""
    return blocks_data.imatrix_for(kind, cols)


def mixed(rows_per: int = 4, cols: int = 256) -> np.ndarray:
    """Rows of every distribution stacked in one matrix (for the slower torch path)."""
    return np.concatenate([make(d, rows_per, cols, seed=3) for d in DISTS])


def block_mismatches(a: np.ndarray, b: np.ndarray, qtype: str) -> int:
    return int((a != b).reshape(a.shape[0], -1, QTYPES[qtype].type_size).any(-1).sum())


@pytest.mark.parametrize("im", IMATRIX, ids=lambda v: v or "no_imatrix")
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("qtype", TYPES)
def test_bytes_equal_llama_cpp(qtype: str, dist: str, im: str | None) -> None:
    x = make(dist)
    qw = imatrix_for(im)
    ours = kquants.quantize_rows(x, qtype, qw)
    theirs = ref.ggml_quantize(x, qtype, qw)
    assert ours.shape == theirs.shape == (ROWS, COLS // 256 * QTYPES[qtype].type_size)
    assert block_mismatches(ours, theirs, qtype) == 0


@pytest.mark.parametrize("qtype", TYPES)
def test_bytes_equal_llama_cpp_random_scales(qtype: str) -> None:
    # Many small rows over 20 orders of magnitude, with and without an imatrix.
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((24, 256)) * 10.0 ** rng.uniform(-10, 4, (24, 1))).astype(np.float32)
    x[::5] = np.abs(x[::5])  # some rows all positive (min clamped to 0)
    x[1::5] = -np.abs(x[1::5])  # some all negative
    for qw in (None, imatrix_for("imatrix", 256), imatrix_for("imatrix_zeros", 256)):
        assert (
            block_mismatches(kquants.quantize_rows(x, qtype, qw), ref.ggml_quantize(x, qtype, qw), qtype) == 0
        )


@pytest.mark.parametrize("im", IMATRIX, ids=lambda v: v or "no_imatrix")
@pytest.mark.parametrize("dist", blocks_data.EXTREME)
@pytest.mark.parametrize("qtype", TYPES)
def test_extreme_values_equal_llama_cpp_on_numpy_and_torch(qtype: str, dist: str, im: str | None) -> None:
    """Ties, signed zeros, subnormals and values beyond fp16 (inf/NaN inside the search), as legacy types."""
    x = make(dist)
    qw = imatrix_for(im)
    theirs = ref.ggml_quantize(x, qtype, qw)
    assert block_mismatches(kquants.quantize_rows(x, qtype, qw), theirs, qtype) == 0
    got = kquants_torch.quantize_rows_torch(
        torch.from_numpy(x), qtype, None if qw is None else torch.from_numpy(qw)
    ).numpy()
    assert block_mismatches(got, theirs, qtype) == 0


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_equals_gguf_and_ggml(qtype: str) -> None:
    x = mixed()
    q = kquants.quantize_rows(x, qtype)
    ours = kquants.dequantize_rows(q, qtype, x.shape[1])
    theirs = gguf.quants.dequantize(q, gguf.GGMLQuantizationType[qtype]).astype(np.float32)
    ggml = ref.ggml_dequantize(q, qtype, x.shape)
    assert ours.shape == x.shape
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    np.testing.assert_array_equal(ours.view(np.uint32), ggml.view(np.uint32))
    # and it is an actual reconstruction, not a constant
    g = x[:2]  # the Gaussian rows
    assert np.abs(ours[:2] - g).max() < 0.6 * np.abs(g).max()


@pytest.mark.parametrize("im", IMATRIX, ids=lambda v: v or "no_imatrix")
@pytest.mark.parametrize("qtype", TYPES)
def test_torch_cpu_equals_numpy(qtype: str, im: str | None) -> None:
    x = mixed()
    qw = imatrix_for(im, x.shape[1])
    want = kquants.quantize_rows(x, qtype, qw)
    got = kquants_torch.quantize_rows_torch(
        torch.from_numpy(x), qtype, None if qw is None else torch.from_numpy(qw)
    )
    assert got.dtype == torch.uint8 and got.device.type == "cpu"
    assert block_mismatches(got.numpy(), ref.ggml_quantize(x, qtype, qw), qtype) == 0  # ggml's own bytes
    assert block_mismatches(got.numpy(), want, qtype) == 0
    back = kquants_torch.dequantize_rows_torch(got, qtype, x.shape[1]).numpy()
    np.testing.assert_array_equal(
        back.view(np.uint32), kquants.dequantize_rows(want, qtype, x.shape[1]).view(np.uint32)
    )


@pytest.mark.skipif(not blocks_data.accelerators(), reason="no CUDA or MPS device")
@pytest.mark.parametrize("im", [None, "imatrix"], ids=lambda v: v or "no_imatrix")
@pytest.mark.parametrize("qtype", TYPES)
def test_torch_accelerator_equals_llama_cpp(qtype: str, im: str | None) -> None:
    x = mixed()
    qw = imatrix_for(im, x.shape[1])
    want = ref.ggml_quantize(x, qtype, qw)
    for dev in blocks_data.accelerators():
        got = kquants_torch.quantize_rows_torch(
            torch.from_numpy(x).to(dev), qtype, None if qw is None else torch.from_numpy(qw).to(dev)
        )
        assert got.device.type == dev
        assert block_mismatches(got.cpu().numpy(), want, qtype) == 0, dev


def test_threads_on_disjoint_rows_give_the_same_bytes() -> None:
    # The kernels release the GIL; callers quantize row ranges from a thread pool.
    x = make("student_t3", rows=16, cols=512, seed=5)
    want = ref.ggml_quantize(x, "Q4_K")
    out = np.zeros_like(want)
    threads = [
        threading.Thread(target=kquants.quantize_rows, args=(x[r : r + 4], "Q4_K", None, out[r : r + 4]))
        for r in range(0, 16, 4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(out, want)


def test_bad_inputs_raise_clear_errors() -> None:
    x = np.zeros((2, 300), np.float32)
    with pytest.raises(QuantizationError, match="multiple of 256"):
        kquants.quantize_rows(x, "Q4_K")
    with pytest.raises(QuantizationError, match="not a K-quant"):
        kquants.quantize_rows(np.zeros((2, 256), np.float32), "Q8_0")
    with pytest.raises(QuantizationError, match="importance matrix has 128"):
        kquants.quantize_rows(np.zeros((2, 256), np.float32), "Q6_K", np.ones(128, np.float32))
    with pytest.raises(QuantizationError, match="does not hold rows"):
        kquants.dequantize_rows(np.zeros((2, 100), np.uint8), "Q6_K", 256)
    with pytest.raises(ValueError, match="multiple of 256"):
        kquants_torch.quantize_rows_torch(torch.zeros(2, 300), "Q4_K")
    assert kquants.quantize_rows(np.zeros((0, 512), np.float32), "Q5_K").shape == (0, 352)
