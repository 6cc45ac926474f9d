"""Legacy, IQ4 and float GGUF formats: bytes identical to llama.cpp and gguf-py, on numpy and torch."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from studio.core.quant import blocks
from studio.core.quant import reference as ref
from studio.core.quant.types import IQ4NL_LEVELS
from tests.core.quant import blocks_data

pytestmark = pytest.mark.skipif(not ref.available(), reason="llama-cpp-python's ggml library is missing")

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"]
# Types gguf.quants can quantize itself (the others are dequantize-only there).
GGUF_QUANTIZES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
ROWS, COLS = 8, 512


def make(dist: str, seed: int = 0) -> np.ndarray:
    """A small (8, 512) float32 matrix of the named kind."""
    return blocks_data.make(dist, ROWS, COLS, seed)


DISTS = blocks_data.DISTS
EXTREME = blocks_data.EXTREME


def imatrix_for(kind: str | None) -> np.ndarray | None:
    return blocks_data.imatrix_for(kind, COLS, floor=0.0)


IM = [None, "imatrix"]


@pytest.mark.parametrize("imatrix", IM, ids=["plain", "imatrix"])
@pytest.mark.parametrize("dist", DISTS + EXTREME)
@pytest.mark.parametrize("qtype", TYPES)
def test_bytes_equal_llama_cpp(qtype: str, dist: str, imatrix: str | None) -> None:
    x = make(dist)
    qw = imatrix_for(imatrix)
    expected = ref.ggml_quantize(x, qtype, qw)
    got = blocks.quantize(x, qtype, qw)
    assert got.dtype == np.uint8 and got.shape == expected.shape
    bad = np.nonzero((got != expected).any(axis=1))[0]
    assert bad.size == 0, f"{qtype}/{dist}: rows {bad.tolist()} differ from llama.cpp"


# Not "signed_zeros": for a block of zeros that starts with -0.0, gguf-py writes d = +0 where
# llama.cpp writes -0 (its running max starts at +0); we follow llama.cpp (test above).
@pytest.mark.parametrize("dist", [*DISTS, "ties"])
@pytest.mark.parametrize("qtype", GGUF_QUANTIZES)
def test_bytes_equal_gguf_py(qtype: str, dist: str) -> None:
    x = make(dist)
    expected = gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype]).view(np.uint8)
    got = blocks.quantize(x, qtype)
    assert np.array_equal(got, expected.reshape(got.shape))


@pytest.mark.parametrize("dist", ["gauss", "outlier", "fp16_limits"])
@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_equals_gguf_py_and_ggml(qtype: str, dist: str) -> None:
    x = make(dist)
    q = ref.ggml_quantize(x, qtype)
    ours = blocks.dequantize(q, qtype, x.shape)
    theirs = gguf.quants.dequantize(q, gguf.GGMLQuantizationType[qtype]).astype(np.float32).reshape(x.shape)
    ggml = ref.ggml_dequantize(q, qtype, x.shape)
    assert ours.dtype == np.float32 and ours.shape == x.shape
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert np.array_equal(ours.view(np.uint32), ggml.view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES)
def test_roundtrip_error_is_small_for_gaussian(qtype: str) -> None:
    # Guards against a quantizer and dequantizer that agree with each other but are both wrong.
    x = make("gauss")
    y = blocks.dequantize(blocks.quantize(x, qtype), qtype, x.shape)
    rel = float(np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2)))
    limit = {"F32": 0, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 0.01}.get(qtype, 0.15)
    assert rel <= limit


@pytest.mark.parametrize("imatrix", IM, ids=["plain", "imatrix"])
@pytest.mark.parametrize("dist", ["gauss", "student_t3", "zeros", "constant", "outlier", "tiny", *EXTREME])
@pytest.mark.parametrize("qtype", TYPES)
def test_torch_cpu_equals_llama_cpp_and_numpy(qtype: str, dist: str, imatrix: str | None) -> None:
    torch = pytest.importorskip("torch")
    x = make(dist, seed=3)
    qw = imatrix_for(imatrix)
    a = blocks.quantize(x, qtype, qw)
    b = blocks.quantize(torch.from_numpy(x), qtype, qw, backend="torch")
    assert np.array_equal(b, ref.ggml_quantize(x, qtype, qw))  # ggml's bytes, not only through numpy
    assert np.array_equal(a, b)


@pytest.mark.skipif(not blocks_data.accelerators(), reason="no CUDA or MPS device")
@pytest.mark.parametrize("imatrix", IM, ids=["plain", "imatrix"])
@pytest.mark.parametrize("dist", ["gauss", "student_t3", "outlier", "tiny"])
@pytest.mark.parametrize("qtype", TYPES)
def test_accelerator_equals_llama_cpp(qtype: str, dist: str, imatrix: str | None) -> None:
    import torch

    x = make(dist, seed=5)
    qw = imatrix_for(imatrix)
    expected = ref.ggml_quantize(x, qtype, qw)
    for dev in blocks_data.accelerators():
        got = blocks.quantize(torch.from_numpy(x).to(dev), qtype, qw)
        assert np.array_equal(got, expected), dev


def test_float_conversions_match_numpy_on_random_bit_patterns() -> None:
    # Every finite float32 class: normals, subnormal halves, overflow to inf, ties.
    rng = np.random.default_rng(11)
    u = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array(
        [0x477FE000, 0x477FEFFF, 0x477FF000, 0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x32FFFFFF],
        dtype=np.uint32,
    )
    f = np.concatenate([u, edges]).view(np.float32)
    f = f[np.isfinite(f)].reshape(1, -1)
    with np.errstate(over="ignore"):
        want16 = f.astype(np.float16).view(np.uint8)
    assert np.array_equal(blocks.quantize(f, "F16"), want16)
    want_bf = gguf.quants.quantize(f, gguf.GGMLQuantizationType.BF16).view(np.uint8)
    assert np.array_equal(blocks.quantize(f, "BF16"), want_bf.reshape(1, -1))


def test_iq4_levels_are_llama_cpps() -> None:
    # one IQ4_NL block with scale 1.0 whose 32 nibbles count 0..15 twice decodes to the level table
    block = np.array([0x00, 0x3C, *(j | (j << 4) for j in range(16))], dtype=np.uint8)
    levels = ref.ggml_dequantize(block, "IQ4_NL", (32,))
    assert levels.tolist() == IQ4NL_LEVELS.tolist() * 2
