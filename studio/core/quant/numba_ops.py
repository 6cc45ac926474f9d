"""Scalar primitives of ggml's reference quantizers for the numba kernels (``legacy``, ``kquants``).

Each one gives C's float32 result bit for bit: ``nearest_int`` is ggml's 1.5*2^23 trick read back
through the float's bits (round half to even below 2^22, and the same bit-derived value C computes
for larger, infinite and NaN arguments, so even blocks of overflowing inputs keep llama.cpp's bytes);
the fp16 conversions round to nearest-even as GGML_FP32_TO_FP16 does. fastmath stays off everywhere:
reassociating a sum or fusing a multiply-add changes the last bit of a scale.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from studio.core.jit import njit

__all__ = [
    "JIT",
    "bits_of",
    "float_of",
    "fp16_bits",
    "fp16_from_bits",
    "fp16_value",
    "nearest_int",
    "nearest_int32",
    "put_half",
]

JIT = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}
"""The numba options of every kernel: cached on disk, GIL released, IEEE float32 semantics."""


@intrinsic
def bits_of(typingctx, x):
    """Reinterpret a float32 as int32 (a C union / memcpy)."""
    if not (isinstance(x, types.Float) and x.bitwidth == 32):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def float_of(typingctx, x):
    """Reinterpret an int32 as float32."""
    if not (isinstance(x, types.Integer) and x.bitwidth == 32):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(x), codegen


# The rounding helpers sit in the innermost loops of every scale search: inline="always" makes numba
# paste them into the caller's IR, so LLVM vectorizes the loop around them as if they were written out.


@njit(inline="always", **JIT)
def nearest_int(v):
    """ggml's nearest_int of a float32, as int64: the low 23 bits of v + 1.5*2^23, minus 2^22."""
    return (np.int64(bits_of(v + np.float32(12582912.0))) & 0x7FFFFF) - 0x400000


@njit(inline="always", **JIT)
def nearest_int32(v):
    """``nearest_int`` kept in int32, for the lane-parallel searches (narrower vectors)."""
    return (bits_of(v + np.float32(12582912.0)) & np.int32(0x7FFFFF)) - np.int32(0x400000)


@njit(**JIT)
def fp16_from_bits(b):
    """float32 bits (a non-negative int) -> IEEE half bits, round to nearest-even (ggml's fp32_to_fp16)."""
    a = b & 0x7FFFFFFF
    sign = (b >> 16) & 0x8000
    if a >= 0x7F800000:
        v = 0x7E00 if a > 0x7F800000 else 0x7C00
    elif a >= 0x477FF000:  # 65520 and above round to infinity
        v = 0x7C00
    elif a >= 0x38800000:  # normal half: drop 13 mantissa bits, ties to even
        v = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
    elif a >= 0x33000000:  # half subnormal: an integer multiple of 2^-24
        m = (a & 0x7FFFFF) | 0x800000
        shift = 126 - (a >> 23)
        q = m >> shift
        rem = m & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (q & 1) == 1):
            q += 1
        v = q
    else:
        v = 0
    return sign | v


@njit(inline="always", **JIT)
def fp16_bits(f):
    """float32 -> IEEE half bits, round to nearest-even (what GGML_FP32_TO_FP16 gives)."""
    return fp16_from_bits(np.int64(bits_of(f)) & 0xFFFFFFFF)


@njit(**JIT)
def fp16_value(h):
    """IEEE half bits -> float32."""
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float32(m) * np.float32(5.9604644775390625e-08)
        return -v if sign else v
    if e == 31:
        bits = sign | 0x7F800000 | (m << 13)
    else:
        bits = sign | ((e + 112) << 23) | (m << 13)
    if bits >= 0x80000000:
        bits -= 0x100000000
    return float_of(np.int32(bits))


@njit(inline="always", **JIT)
def put_half(row, pos, f):
    """Write float32 ``f`` as little-endian fp16 at ``row[pos:pos+2]``; returns the stored value.

    Inlined so that a caller that ignores the value does not compute it.
    """
    h = fp16_bits(f)
    row[pos] = h & 0xFF
    row[pos + 1] = h >> 8
    return fp16_value(h)
