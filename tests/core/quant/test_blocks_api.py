"""The public quantize/dequantize dispatcher: shapes, validation, chunking, cancellation, progress."""

from __future__ import annotations

import importlib.util

import gguf
import numpy as np
import pytest

from studio.core.errors import QuantizationError
from studio.core.jobs import JobCancelled, JobContext
from studio.core.quant import blocks
from studio.core.quant import reference as ref

needs_ref = pytest.mark.skipif(not ref.available(), reason="llama-cpp-python's ggml library is missing")
ALL = list(blocks.QTYPES)
KQUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def test_every_type_geometry_matches_ggml() -> None:
    for name, info in blocks.QTYPES.items():
        if name in gguf.GGMLQuantizationType.__members__:
            bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        else:  # a type gguf-py cannot name yet (Q2_0 in gguf 0.19): the pinned ggml library's traits
            traits = ref._lib().ggml_get_type_traits(info.type_id).contents
            assert traits.type_name.decode().upper() == name
            bs, ts = int(traits.blck_size), int(traits.type_size)
        assert (info.block_size, info.type_size) == (bs, ts), name
        assert blocks.row_bytes(name, 4096) == 4096 // bs * ts


@pytest.mark.parametrize(
    ("qtype", "n", "fallback"),
    [
        ("Q4_K", 4096 + 32, "Q5_0"),
        ("Q5_K", 288, "Q5_1"),
        ("Q6_K", 96, "Q8_0"),
        ("Q2_K", 160, "Q4_0"),
        ("Q3_K", 160, "Q4_0"),
        ("IQ4_XS", 96, "IQ4_NL"),
        ("Q4_K", 100, "F16"),
        ("Q8_0", 33, "F16"),
        ("IQ4_NL", 48, "F16"),
    ],
)
def test_fault21_bad_row_length_names_shape_and_fallback(qtype: str, n: int, fallback: str) -> None:
    # FAULTS row 21 (odd shapes): a clear error, never a silent garbage tensor.
    x = np.ones((3, n), np.float32)
    with pytest.raises(QuantizationError) as err:
        blocks.quantize(x, qtype)
    msg = str(err.value)
    assert f"(3, {n})" in msg and qtype in msg and fallback in msg
    assert blocks.fallback_type(qtype, n).qtype == fallback


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_fault19_nan_or_inf_is_refused_with_count_and_first_index(bad: float, backend: str) -> None:
    # FAULTS row 19: tensors with NaN/Inf are refused with the count and where the first one is.
    pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2, 3, 64), dtype=np.float32)
    x[1, 0, 5] = bad
    x[1, 2, 63] = bad
    with pytest.raises(QuantizationError) as err:
        blocks.quantize(x, "Q8_0", backend=backend)
    msg = str(err.value)
    assert "2 NaN or infinite" in msg and "(1, 0, 5)" in msg and "(2, 3, 64)" in msg


def test_fault19_nan_found_in_a_later_chunk_of_a_threaded_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks, "_CPU_CHUNK", 256)
    x = np.zeros((40, 64), np.float32)
    x[33, 7] = np.nan
    x[2, 1] = np.inf
    with pytest.raises(QuantizationError) as err:
        blocks.quantize(x, "Q4_0", threads=4)
    assert "2 NaN or infinite" in str(err.value) and "(2, 1)" in str(err.value)


@pytest.mark.parametrize("qtype", ALL)
def test_fault21_empty_tensors_give_empty_output_without_error(qtype: str) -> None:
    # FAULTS row 21: dimension 0 anywhere; no division by zero, nothing written.
    torch = pytest.importorskip("torch")
    a = blocks.quantize(np.zeros((0, 256), np.float32), qtype)
    assert a.shape == (0, blocks.row_bytes(qtype, 256))
    b = blocks.quantize(np.zeros((4, 0), np.float32), qtype)
    assert b.shape == (4, 0)
    c = blocks.quantize(torch.zeros((2, 0, 256)), qtype, backend="torch")
    assert c.shape == (0, blocks.row_bytes(qtype, 256))
    assert blocks.dequantize(a, qtype, (0, 256)).shape == (0, 256)
    assert blocks.dequantize(b, qtype, (4, 0)).shape == (4, 0)


@needs_ref
@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "IQ4_NL"])
def test_fault21_one_dimensional_tensor_is_one_row(qtype: str) -> None:
    v = np.linspace(-1, 1, 96, dtype=np.float32)
    got = blocks.quantize(v, qtype)
    assert got.shape == (1, blocks.row_bytes(qtype, 96))
    assert np.array_equal(got, ref.ggml_quantize(v.reshape(1, -1), qtype))
    assert blocks.dequantize(got, qtype, (96,)).shape == (96,)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16"])
def test_fault21_scalars_allowed_for_float_types(qtype: str) -> None:
    q = blocks.quantize(np.float32(1.5), qtype)
    assert q.shape == (1, blocks.QTYPES[qtype].type_size)
    assert blocks.dequantize(q, qtype, ()).shape == ()
    assert float(blocks.dequantize(q, qtype, ())) == 1.5


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "IQ4_NL"])
def test_fault21_scalars_refused_for_block_types(qtype: str) -> None:
    with pytest.raises(QuantizationError, match="0-d scalar"):
        blocks.quantize(np.float32(1.5), qtype)


@needs_ref
def test_leading_dims_are_flattened_into_rows() -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 64), dtype=np.float32)
    got = blocks.quantize(x, "Q5_1")
    assert got.shape == (24, blocks.row_bytes("Q5_1", 64))
    assert np.array_equal(got, ref.ggml_quantize(x.reshape(24, 64), "Q5_1"))
    back = blocks.dequantize(got, "Q5_1", x.shape)
    assert back.shape == x.shape


@needs_ref
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_1", "IQ4_XS", "F16"])
def test_many_chunks_on_many_threads_equal_one_call(monkeypatch: pytest.MonkeyPatch, qtype: str) -> None:
    monkeypatch.setattr(blocks, "_CPU_CHUNK", 512)  # 2 rows of 256 per chunk -> 37 chunks
    x = np.random.default_rng(2).standard_normal((73, 256), dtype=np.float32)
    for threads in (1, 3):
        assert np.array_equal(blocks.quantize(x, qtype, threads=threads), ref.ggml_quantize(x, qtype))


def test_progress_is_reported_and_cancellation_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks, "_CPU_CHUNK", 256)
    x = np.ones((64, 256), np.float32)
    seen: list[tuple[int, int]] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append((d, t)), min_interval=0.0)
    blocks.quantize(x, "Q8_0", ctx=ctx, threads=2)
    assert seen and seen[-1] == (64, 64)
    assert all(t == 64 for _, t in seen)
    stop = JobContext()
    stop.cancel()
    with pytest.raises(JobCancelled):
        blocks.quantize(x, "Q8_0", ctx=stop, threads=1)
    with pytest.raises(JobCancelled):
        blocks.quantize(x, "Q8_0", ctx=stop, threads=3)


def test_imatrix_length_and_values_are_checked() -> None:
    x = np.ones((2, 64), np.float32)
    with pytest.raises(QuantizationError, match="64"):
        blocks.quantize(x, "IQ4_NL", np.ones(32, np.float32))
    with pytest.raises(QuantizationError, match="NaN"):
        blocks.quantize(x, "IQ4_NL", np.full(64, np.nan, np.float32))


def test_unknown_type_and_backend_are_refused() -> None:
    x = np.ones((1, 32), np.float32)
    with pytest.raises(QuantizationError, match="Unknown quantization type"):
        blocks.quantize(x, "Q7_0")
    with pytest.raises(QuantizationError, match="backend"):
        blocks.quantize(x, "Q8_0", backend="fortran")


def test_dequantize_checks_data_size() -> None:
    with pytest.raises(QuantizationError, match="bytes"):
        blocks.dequantize(np.zeros(33, np.uint8), "Q8_0", (1, 32))


@needs_ref
def test_gguf_enum_types_and_float64_and_torch_inputs() -> None:
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((4, 64))
    want = ref.ggml_quantize(x.astype(np.float32), "Q4_1")
    assert np.array_equal(blocks.quantize(x, gguf.GGMLQuantizationType.Q4_1), want)
    t = torch.from_numpy(x.astype(np.float32))
    assert np.array_equal(blocks.quantize(t, "Q4_1"), want)
    assert np.array_equal(blocks.quantize(t, "Q4_1", backend="torch"), want)
    bf = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    assert np.array_equal(blocks.quantize(bf, "BF16"), bf.view(torch.uint8).numpy().reshape(4, -1))


@needs_ref
@pytest.mark.parametrize("qtype", KQUANTS)
def test_kquants_dispatch_to_teammate_module_or_say_unavailable(qtype: str) -> None:
    x = np.random.default_rng(4).standard_normal((4, 256), dtype=np.float32)
    if importlib.util.find_spec("studio.core.quant.kquants") is None:
        with pytest.raises(QuantizationError, match="K-quant"):
            blocks.quantize(x, qtype)
        return
    assert np.array_equal(blocks.quantize(x, qtype), ref.ggml_quantize(x, qtype))
    q = ref.ggml_quantize(x, qtype)
    want = gguf.quants.dequantize(q, gguf.GGMLQuantizationType[qtype]).reshape(x.shape)
    assert np.array_equal(blocks.dequantize(q, qtype, x.shape), want.astype(np.float32))


# ------------------------------------------------------------------ inputs a library user may pass (QA)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "IQ4_XS", "BF16"])
def test_array_layouts_and_byte_orders_give_the_same_bytes(qtype: str) -> None:
    import torch

    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    want = blocks.quantize(x, qtype)
    wide = np.repeat(x, 2, axis=1)
    for v in (
        np.asfortranarray(x),
        wide[:, ::2],  # strided view
        x.astype(">f4"),  # big-endian
        x.reshape(5, 1, 512),
        x.tolist(),
        torch.from_numpy(wide)[:, ::2],
        torch.from_numpy(np.ascontiguousarray(x.T)).T,
    ):
        assert np.array_equal(blocks.quantize(v, qtype), want)
    half = x.astype(np.float16)
    assert np.array_equal(blocks.quantize(half, qtype), blocks.quantize(half.astype(np.float32), qtype))
    bf = torch.from_numpy(x).to(torch.bfloat16)
    assert np.array_equal(blocks.quantize(bf, qtype), blocks.quantize(bf.float().numpy(), qtype))


def test_complex_object_and_text_inputs_are_refused_clearly() -> None:
    import torch

    with pytest.raises(QuantizationError, match="dtype complex128; only real numbers"):
        blocks.quantize(np.ones((2, 64), complex), "Q8_0")  # used to drop the imaginary part silently
    with pytest.raises(QuantizationError, match="dtype complex64"):
        blocks.quantize(torch.ones((2, 64), dtype=torch.complex64), "Q8_0")
    with pytest.raises(QuantizationError, match="dtype object"):
        blocks.quantize(np.array([[None] * 32]), "Q8_0")  # used to claim 32 NaN values
    with pytest.raises(QuantizationError, match="A str cannot be quantized"):
        blocks.quantize("abc", "Q8_0")  # used to leak numpy's ValueError
    ints = np.arange(-64, 64).reshape(2, 64)
    assert np.array_equal(blocks.quantize(ints, "Q8_0"), blocks.quantize(ints.astype(np.float32), "Q8_0"))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_float64_beyond_float32_range_is_refused_not_written_as_garbage(backend: str) -> None:
    import torch

    x = np.zeros((2, 256))
    x[1, 7] = 1e300
    for v in (x, torch.from_numpy(x)):  # the torch path checked finiteness before casting to float32
        with pytest.raises(QuantizationError, match=r"1 NaN or infinite.*float32's range.*\(1, 7\)"):
            blocks.quantize(v, "Q4_K", backend=backend)


def test_ggml_type_ids_name_types_as_in_gguf_tensor_infos() -> None:
    x = np.random.default_rng(4).standard_normal((2, 256)).astype(np.float32)
    assert np.array_equal(blocks.quantize(x, int(gguf.GGMLQuantizationType.Q4_K)), blocks.quantize(x, "Q4_K"))
    with pytest.raises(QuantizationError, match="Unknown quantization type 999"):
        blocks.quantize(x, 999)


_NJIT_PROBE = """
import sys
import numba
sys.path.insert(0, sys.argv[1])
from studio.core.jit import njit
src = sys.argv[2]
code = compile(open(src).read(), src, "exec")
ns = {"njit": njit, "__file__": src, "__name__": "probe"}
exec(code, ns)
print(ns["twice"](21))
try:
    numba.njit(cache=True)(ns["twice"].py_func)
    print("numba-cached")
except RuntimeError:
    print("numba-refused")
"""


def test_kernels_compile_when_no_numba_cache_folder_is_writable(tmp_path) -> None:
    """A read-only install: numba's cache=True raised at import; now it only costs compile time."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__pycache__").write_text("")  # a file: the in-tree cache folder cannot be made (even as root)
    src = pkg / "probe.py"
    src.write_text("@njit(cache=True, nogil=True)\ndef twice(v):\n    return 2 * v\n")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": str(blocker / "numba"),
        "HOME": str(blocker),
        "XDG_CACHE_HOME": str(blocker),
    }
    root = str(Path(blocks.__file__).resolve().parents[3])
    out = subprocess.run(
        [sys.executable, "-c", _NJIT_PROBE, root, str(src)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["42", "numba-refused"]  # the situation is real: numba alone refuses


def test_torch_cpu_path_checks_for_cancellation_every_million_values() -> None:
    """Its chunks were 4M values (~2 s of torch on a CPU), so a cancelled job ran on that long."""
    import torch

    x = torch.zeros((1024, 4096))  # 4M values
    seen: list[int] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append(d), min_interval=0.0)
    blocks.quantize(x, "Q8_0", ctx=ctx, backend="torch")
    assert seen == [256, 512, 768, 1024]
