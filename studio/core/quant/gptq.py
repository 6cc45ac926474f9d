"""GPTQ whose rounding is a GGUF block format: codes chosen under llama.cpp's scales, errors sent forward.

``gptq_quantize(w, h, qtype)`` quantizes one linear weight ``w`` (rows = output features × columns =
input features; blocks run along the columns, as in the GGUF file) given the Hessian ``h = 2XᵀX/n``
of its inputs, in torch on the tensor's device (CPU, CUDA or MPS), float32:

1. Dead columns (``h_dd = 0``: inputs always zero) get ``h_dd = 1`` and ``w_:d = 0``; ``h`` is damped
   with ``λ · mean(diag h)`` (``damp``), and when its Cholesky factor does not exist the damping
   grows tenfold and is tried again (up to ``MAX_DAMP``).
2. The (super-)block scales and mins are llama.cpp's own search on the weights, imatrix-weighted
   (``grid.search``, the bit-exact kernels): on the float weights before the sweep (``scales="float"``,
   the static groups that act-order needs), or on the error-updated weights when the sweep reaches
   each block (``scales="arrival"``, what GPTQ does with groups).
3. The sweep walks the columns (in order of decreasing ``h_dd`` with ``act_order``; block membership
   stays with the original column positions), in lazy batches of ``block_size`` columns: each code is
   the grid value nearest to the current weight under the fixed scales of its group, and the rounding
   error flows to the columns not yet quantized through the upper Cholesky factor of ``h⁻¹``.
4. ``grid.encode`` writes exactly those scales and codes: a standard GGUF tensor.

Memory is the weight, the Hessian and its factor (a few copies of ``rows × n`` and ``n × n`` floats).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jobs import JobContext, null_context
from studio.core.quant import grid as G

MAX_DAMP = 10.0  # relative damping beyond which the Hessian is given up (the caller falls back)
SCALE_MODES = ("float", "arrival")
DAMP_MODES = ("mean", "diag")


@dataclass(frozen=True)
class GptqOptions:
    """How GPTQ runs (the defaults are the measured best on a real model; see bench/gptq_quality.py)."""

    block_size: int = 128  # columns per lazy batch
    # λ: added to the diagonal as λ · H_dd ("diag") or λ · mean(diag H) ("mean"). H + λ·diag(H) is
    # (1 + λ) times a blend of the calibration's Hessian with its diagonal, the imatrix, whose rounding
    # carries to other kinds of text: GPTQ fitted to H alone fits the calibration's off-diagonal
    # correlations, which another kind of text does not share. KL on text of another kind than the
    # calibration's (llama-perplexity): the 1.5B bench model's Q3_K_M, prose → Python, 0.0457 at 0.01
    # "mean" (the default before), 0.0361 / 0.0332 / 0.0318 / 0.0326 at 0.3 / 1 / 3 / 10 "diag" (the
    # imatrix search alone, λ → ∞: 0.0357); the demo's Q4_K_M / Q3_K_M, languages → English, 0.0237 /
    # 0.0626 at 0.01 "mean", 0.0209 / 0.0527 at 1 "diag", 0.0220 / 0.0531 at 3
    damp: float = 3.0
    damp_mode: str = "diag"
    # columns by decreasing H_dd (static groups: scales from the float weights). On SmolLM2-135M
    # (bench/gptq_quality.py, KL at Q4_K_M / Q3_K_M): gptq 0.0239 / 0.0631 act-order against 0.0319 / 0.0691
    # in order; awq+gptq 0.0179 / 0.0557 against 0.0194 / 0.0580
    act_order: bool = True
    scales: str = "arrival"  # "float" (fixed before the sweep) or "arrival" (searched on updated weights)
    # after the sweep, re-fit each super-block's fp16 scale to its codes (the lattice i-quants, which
    # always do with arrival scales; gptq_lattice.refit_super_scales)
    refit: bool = False

    def __post_init__(self) -> None:
        if self.scales not in SCALE_MODES:
            raise QuantizationError(
                f"Unknown GPTQ scale mode {self.scales!r}; use {' or '.join(SCALE_MODES)}."
            )
        if self.damp_mode not in DAMP_MODES:
            raise QuantizationError(
                f"Unknown GPTQ damping {self.damp_mode!r}; use {' or '.join(DAMP_MODES)}."
            )
        if self.block_size < 1 or not (0 < self.damp <= MAX_DAMP):
            raise QuantizationError("GPTQ needs a block size of at least 1 and a damping in (0, 10].")


@dataclass(frozen=True)
class GptqResult:
    """One quantized weight: its GGUF bytes and how the sweep went."""

    data: np.ndarray  # uint8 (rows, row bytes) of ``qtype``
    qtype: str
    damp: float  # the damping that made the Hessian positive definite
    dead_columns: int
    error: float  # tr((W − Ŵ) H (W − Ŵ)ᵀ) of the result
    rtn_error: float  # the same for llama.cpp's own codes under the float-weight search
    notes: tuple[str, ...] = ()

    @property
    def gain(self) -> float:
        """Output error relative to llama.cpp's rounding (below 1 is better)."""
        return self.error / self.rtn_error if self.rtn_error > 0 else 1.0


class HessianError(QuantizationError):
    """The Hessian stays singular whatever the damping (the caller quantizes without GPTQ)."""


# ------------------------------------------------------------------------------------------ helpers


class _TorchGrid:
    """A grid's scales and offsets on the sweep's device, with the nearest-code rule per column."""

    def __init__(self, g: G.BlockGrid, device: Any) -> None:
        import torch

        sp = g.spec
        self.sp = sp
        self.group = sp.group
        self.template = np.array(g.template)  # updated block by block in "arrival" mode
        self.scale = torch.as_tensor(g.scale, device=device).clone()
        self.offset = None if g.offset is None else torch.as_tensor(g.offset, device=device).clone()
        self.levels = torch.as_tensor(sp.levels, device=device)
        self.mids = (self.levels[1:] + self.levels[:-1]) / 2
        self.lo = 0 if sp.base is None else sp.base
        self.top = sp.n_levels - 1

    def put(self, c0: int, part: G.BlockGrid) -> None:
        """Replace the scales of columns [c0, c0 + part's width) with ``part``'s."""
        import torch

        sp = self.sp
        g0 = c0 // sp.group
        gs = part.scale.shape[1]
        self.scale[:, g0 : g0 + gs] = torch.as_tensor(part.scale, device=self.scale.device)
        if self.offset is not None and part.offset is not None:
            self.offset[:, g0 : g0 + gs] = torch.as_tensor(part.offset, device=self.offset.device)
        b0 = c0 // sp.block * sp.nbytes
        self.template[:, b0 : b0 + part.template.shape[1]] = part.template

    def nearest(self, w: Any, cols: Any) -> tuple[Any, Any]:
        """(codes, values) of weights ``w`` (rows × k) of original columns ``cols`` (k,) on the grid."""
        import torch

        g = cols // self.group
        s = self.scale[:, g]
        t = w if self.offset is None else w - self.offset[:, g]
        t = torch.where(s != 0, t / torch.where(s != 0, s, torch.ones_like(s)), torch.zeros_like(t))
        if self.sp.base is not None:
            k = torch.clamp(torch.round(t) - self.lo, 0, self.top).to(torch.long)
        else:
            k = torch.searchsorted(self.mids, t.contiguous())
        q = s * self.levels[k]
        if self.offset is not None:
            q = q + self.offset[:, g]
        return k, q


def _use_numba(device: Any, backend: str) -> bool:
    from studio.core.jit import HAVE_NUMBA

    return backend == "auto" and device.type == "cpu" and HAVE_NUMBA


def _columns_torch(
    W1: Any, E1: Any, Hi1: Any, lo: int, hi: int, cols: Any, tg: _TorchGrid, codes: Any, pool: Any = None
) -> None:
    """Columns [lo, hi) of a lazy batch, one after the other, in torch (any device)."""
    import torch

    for i in range(lo, hi):
        wc = W1[:, i : i + 1]
        k, q = tg.nearest(wc, cols[i : i + 1])
        codes[:, cols[i]] = k[:, 0].to(torch.uint8)
        err = (wc[:, 0] - q[:, 0]) / Hi1[i, i]
        W1[:, i:] -= err[:, None] * Hi1[i, i:][None, :]
        E1[:, i] = err


def _columns_numba(
    W1: Any, E1: Any, Hi1: Any, lo: int, hi: int, cols: Any, tg: _TorchGrid, codes: Any, pool: Any = None
) -> None:
    """Columns [lo, hi) of a lazy batch in the compiled kernel; rows are independent, so ``pool``
    runs two halves of them at once (the kernel releases the GIL)."""
    from studio.core.quant.gptq_kernel import sweep_columns

    rows = W1.shape[0]
    off = tg.offset.numpy() if tg.offset is not None else tg.scale.numpy()
    base = 0 if tg.sp.base is None else tg.sp.base
    args = (
        W1.numpy(),
        E1.numpy(),
        Hi1.numpy(),
        lo,
        hi,
        cols.numpy(),
        tg.group,
        tg.scale.numpy(),
        off,
        tg.offset is not None,
        tg.levels.numpy(),
        base,
        tg.sp.base is not None,
        tg.mids.numpy(),
        codes.numpy(),
    )
    if pool is None or rows < 64:
        sweep_columns(*args, 0, rows)
        return
    for f in [pool.submit(sweep_columns, *args, r0, r1) for r0, r1 in ((0, rows // 2), (rows // 2, rows))]:
        f.result()


_FINITE_BLOCK = 1 << 22  # values ``all_finite`` checks at once (32 MB of float64)


def all_finite(t: Any) -> bool:
    """Whether every value of the tensor ``t`` is finite, checked a block of rows at a time: torch's
    ``isfinite`` on the whole makes an absolute-value copy and two boolean ones (1.6 float32 copies of
    an 8B's 0.8 GB ``down_proj`` Hessian at once; 2.75 of a float64 one)."""
    import torch

    if t.dim() < 2:
        return bool(torch.isfinite(t).all())
    step = max(1, _FINITE_BLOCK // max(1, t[0].numel()))
    return all(bool(torch.isfinite(t[r : r + step]).all()) for r in range(0, int(t.shape[0]), step))


_TRANSPOSE_ROWS = 256  # rows of the strip ``_transpose_`` swaps at once (a 256 × n temporary)


def _transpose_(t: Any) -> Any:
    """Transpose the square tensor ``t`` in place, a strip of rows against its column at a time (no second
    n × n copy): a row-major buffer then holds the column-major layout LAPACK works in."""
    n = int(t.shape[0])
    for i0 in range(0, n, _TRANSPOSE_ROWS):
        i1 = min(i0 + _TRANSPOSE_ROWS, n)
        d = t[i0:i1, i0:i1]
        d.copy_(d.t().clone())
        if i1 < n:
            strip = t[i0:i1, i1:].clone()
            t[i0:i1, i1:] = t[i1:, i0:i1].t()
            t[i1:, i0:i1] = strip.t()
    return t


def _inverse_factor(build: Callable[[], Any], damp: float, mode: str) -> tuple[Any, float, int]:
    """Upper Cholesky factor of (H + damping)⁻¹, H = ``build()`` (a fresh n × n copy this call may
    overwrite); the damping grows tenfold until H is positive definite, on a fresh copy each time. The
    damped H, its factor, the inverse and the inverse's factor all take turns in that one buffer: LAPACK
    works in place on a column-major matrix, so the row-major copy is transposed in place first and its
    column-major view handed to torch, and the factor transposed back at the end. Given the row-major
    buffer itself, torch made a column-major copy for every call (2 copies at once, not 1: at 8B widths,
    n = 14336, each float32 copy is 0.8 GB). The values LAPACK sees are the same either way."""
    import torch

    work = build()
    diag0 = torch.diagonal(work)
    mean = float(diag0.mean())  # on the strided view, as before: a contiguous copy sums in another order
    diag0 = diag0.clone()
    lam = damp
    tries = 0
    info = torch.empty((), dtype=torch.int32, device=work.device)
    flip = work.device.type in ("cpu", "cuda")
    while lam <= MAX_DAMP * (1 + 1e-9):
        if work is None:
            work = build()
        wd = torch.diagonal(work)
        if mode == "diag":
            wd += lam * diag0 + 1e-12 * max(mean, 1e-30)
        else:
            wd += lam * max(mean, 1e-30)
        # the same matrix, column-major in work's buffer (Metal keeps torch's own copies: its kernels differ)
        col = _transpose_(work).mT if flip else work
        torch.linalg.cholesky_ex(col, out=(col, info))
        if int(info) == 0:
            torch.cholesky_inverse(col, out=col)
            torch.linalg.cholesky_ex(col, upper=True, out=(col, info))
            if int(info) == 0 and all_finite(work):
                return (_transpose_(work) if flip else work), lam, tries
        work = col = None  # freed before the next copy is built
        tries += 1
        lam *= 10.0
    raise HessianError(f"The Hessian is not positive definite even with damping {MAX_DAMP:g}.")


class FactorCache:
    """The inverse factors already made, by Hessian: tensors that read the same input (q/k/v, gate/up)
    share one Hessian and so one factor, and a probe rounds one tensor to many types on one Hessian.
    Keyed by the Hessian object (held, so its id cannot be reused) and how the factor was made; ``keep``:
    how many factors are held at most (0: all), the oldest let go first."""

    def __init__(self, keep: int = 0) -> None:
        self._made: dict[tuple[int, tuple[Any, ...]], tuple[Any, tuple[Any, float, int]]] = {}
        self.keep = keep

    def factor(self, h: Any, how: tuple[Any, ...], make: Callable[[], tuple[Any, float, int]]) -> Any:
        """``make()`` once per (``h``, ``how``); the same (factor, damping, tries) afterwards."""
        key = (id(h), how)
        hit = self._made.get(key)
        if hit is not None and hit[0] is h:
            return hit[1]
        if self.keep:
            while len(self._made) >= self.keep:  # let the oldest go before the new one is made
                self._made.pop(next(iter(self._made)))
        made = make()
        self._made[key] = (h, made)
        return made

    def release(self, h: Any) -> None:
        """Let go of the factors made from the Hessian ``h``: no tensor left to round reads it."""
        for key in [k for k, (held, _) in self._made.items() if held is h]:
            del self._made[key]


def inverse_factor(
    h: Any, build: Callable[[], Any], damp: float, mode: str, how: tuple[Any, ...], cache: FactorCache | None
) -> tuple[Any, float, int]:
    """``_inverse_factor(build, damp, mode)``, from ``cache`` when ``build`` makes its H from ``h`` the
    same way (``how``: the column order's recipe) as before; the factor is only read by the sweeps."""
    if cache is None:
        return _inverse_factor(build, damp, mode)
    return cache.factor(h, (*how, damp, mode), lambda: _inverse_factor(build, damp, mode))


@dataclass(frozen=True)
class GptqStart:
    """What every GPTQ sweep starts from: the weight in float32 and the caller's Hessian (``w0``, ``h``;
    float32 or float64, on the weight's device), the working
    copy ``W`` with the ``n_dead`` never-active columns (``dead``, their indices) zeroed, and ``diag``,
    H's diagonal with theirs set to 1. The working Hessian is made later by ``working_hessian``, already
    in the sweep's column order, so that no unpermuted copy of it is held."""

    w0: Any
    h: Any
    W: Any
    dead: Any
    diag: Any
    n_dead: int


_ERROR_BLOCK = 1 << 24  # values of H converted to float32 at once (output_error)
_GATHER_ROWS = 256  # rows whose columns ``working_hessian`` reorders at once (a 256 × n temporary)


def working_hessian(h: Any, dead: Any, perm: Any = None) -> Any:
    """One n × n float32 copy of ``h`` (float32 or float64) with the dead columns' diagonal set to 1, rows
    and columns in ``perm``'s order (``h[perm][:, perm]``): a block of rows at a time, gathered, converted
    and permuted, so there is never a second whole copy (nor a float64 one)."""
    import torch

    n = int(h.shape[0])
    if perm is None:
        H = h.to(torch.float32, copy=True)
    else:
        H = torch.empty((n, n), dtype=torch.float32, device=h.device)
        for r0 in range(0, n, _GATHER_ROWS):
            H[r0 : r0 + _GATHER_ROWS] = h.index_select(0, perm[r0 : r0 + _GATHER_ROWS]).index_select(1, perm)
    if dead.numel():
        pos = dead if perm is None else torch.argsort(perm)[dead]
        H[pos, pos] = 1.0
    return H


def gptq_start(w: Any, h: Any, qtype: str, block: int) -> GptqStart:
    """Checks ``w`` (rows × n, ``n`` a multiple of ``block``) against ``h`` (n × n, finite) and sets the
    dead columns (``h_dd ≤ 0``) to ``h_dd = 1``, ``w_:d = 0``; shared by the block and lattice sweeps.
    ``h`` stays the caller's float64 or float32 tensor (on the weight's device): a float32 copy of a
    float64 one was another 0.8 GB at 8B's 14336-wide down_proj input, held through the sweep."""
    import torch

    n = int(w.shape[1])
    if n % block:
        raise QuantizationError(f"{qtype} needs rows of a multiple of {block} weights, not {n}.")
    if tuple(h.shape) != (n, n):
        raise QuantizationError(
            f"A Hessian of shape {tuple(h.shape)} does not fit a weight with {n} columns."
        )
    w0 = w.detach().to(torch.float32)
    h = h.detach()
    if h.dtype not in (torch.float32, torch.float64) or (h.dtype == torch.float64 and w.device.type == "mps"):
        h = h.to(torch.float32)  # Metal has no float64
    h = h.to(device=w.device)
    if not all_finite(h):
        raise HessianError("The Hessian holds NaN or infinite values.")
    W = w0.clone()
    diag = torch.diagonal(h).to(torch.float32, copy=True)  # float32: the column order as before
    dead = torch.nonzero(diag <= 0).reshape(-1)
    n_dead = int(dead.numel())
    if n_dead:
        diag[dead] = 1.0
        W[:, dead] = 0.0
    return GptqStart(w0, h, W, dead, diag, n_dead)


def gptq_notes(tries: int, lam: float, damp: float, n_dead: int) -> tuple[str, ...]:
    """The sentences a GPTQ result carries about its damping and its dead columns."""
    notes: list[str] = []
    if tries:
        notes.append(f"the Hessian needed damping {lam:g} (not {damp:g}) to be positive definite")
    if n_dead:
        notes.append(f"{n_dead} input column(s) never active: their weights were set to zero")
    return tuple(notes)


def output_error(w: Any, q: Any, h: Any) -> float:
    """tr((W − Q) H (W − Q)ᵀ): the summed squared output error over the calibration rows, ×2/n. In float32
    with a float64 ``h`` read a block of its rows at a time: neither a float32 copy of it (0.8 GB at
    14336 wide) nor float64 products (twice the time)."""
    import torch

    e = (w - q).to(torch.float32)
    n = int(h.shape[0])
    step = max(1, _ERROR_BLOCK // max(1, n))
    eh = e[:, :step] @ h[:step].to(torch.float32)
    for k0 in range(step, n, step):
        eh.addmm_(e[:, k0 : k0 + step], h[k0 : k0 + step].to(torch.float32))
    return float((eh * e).sum(dtype=torch.float64))


_ERROR_ROWS = 1 << 24  # weights decoded at once for the output errors (64 MB of float32)


def output_error_by_rows(w0: Any, h: Any, values: Callable[[int, int], Any]) -> float:
    """``output_error`` of ``w0`` against its quantized values, a block of rows at a time: ``values(a, b)``
    gives rows ``a:b``'s values. Whole, each result (decoded with its index array, its error and the error's
    products) held five or six float32 copies of the matrix: 1.2–1.4 GB for an 8B's ``down_proj``, beside
    its Hessian and inverse factor (GPTQ's and AWQ's peak on the 8B fixture)."""
    rows, n = (int(x) for x in w0.shape)
    step = max(1, _ERROR_ROWS // max(1, n))
    total = 0.0
    for a in range(0, rows, step):
        b = min(a + step, rows)
        total += output_error(w0[a:b], values(a, b), h)
    return total


def _grids(qtype: str) -> Any:
    """The module that takes ``qtype``'s blocks apart: ``grid``, or ``gptq_lowbit`` for the scalar low-bit types."""
    if qtype in G.GRID_TYPES:
        return G
    from studio.core.quant import gptq_lowbit  # numba's kernels: only when a low-bit type is asked for

    return gptq_lowbit if qtype in gptq_lowbit.LOWBIT_GRID_TYPES else G


def _search(w: Any, qtype: str, imatrix: np.ndarray | None) -> tuple[G.BlockGrid, np.ndarray]:
    x = w.detach()
    if x.device.type == "cpu":
        x = x.numpy()
    return _grids(qtype).search(x, qtype, imatrix)


# ------------------------------------------------------------------------------------------ GPTQ


def _sweep(
    W: Any,
    hinv: Any,
    bs: int,
    sp: G.GridSpec,
    arrival: bool,
    cols: Any,
    imatrix: np.ndarray | None,
    tgrid: _TorchGrid,
    codes: Any,
    inner: Any,
    pool: Any,
    ctx: JobContext,
) -> None:
    """The lazy batches: each batch's columns one by one (``inner``), then its errors onto the rest."""
    import torch

    n = W.shape[1]
    for i1 in range(0, n, bs):
        ctx.check_cancelled()
        i2 = min(i1 + bs, n)
        W1 = W[:, i1:i2].clone()
        E1 = torch.zeros_like(W1)
        Hi1 = hinv[i1:i2, i1:i2].contiguous()
        cb = cols[i1:i2].contiguous()
        step = sp.block if arrival else i2 - i1
        for b0 in range(0, i2 - i1, step):
            b1 = min(b0 + step, i2 - i1)
            if arrival:  # llama.cpp's search on this block's current (error-updated) weights
                c0 = i1 + b0
                qw = None if imatrix is None else imatrix[c0 : c0 + sp.block]
                part, _ = _search(W1[:, b0:b1], sp.qtype, qw)
                tgrid.put(c0, part)
            inner(W1, E1, Hi1, b0, b1, cb, tgrid, codes, pool)
        if i2 < n:
            W[:, i2:] -= E1 @ hinv[i1:i2, i2:]


def gptq_quantize(
    w: Any,
    h: Any,
    qtype: str,
    *,
    imatrix: np.ndarray | None = None,
    options: GptqOptions | None = None,
    ctx: JobContext | None = None,
    backend: str = "auto",
    factors: FactorCache | None = None,
) -> GptqResult:
    """GPTQ of weight ``w`` (torch, rows × n) with Hessian ``h`` (torch, n × n) onto ``qtype``'s grid.

    ``imatrix`` (n,) weights llama.cpp's scale search (None: its unweighted search). Raises
    ``HessianError`` when no damping up to ``MAX_DAMP`` makes ``h`` positive definite. ``backend``:
    "auto" sweeps the columns of a CPU tensor in a compiled kernel (rows in parallel, the same
    arithmetic) and those of a CUDA/MPS tensor in torch; "torch" forces torch everywhere. ``factors``
    shares the inverse factor between calls on the same Hessian object (the same bytes, made once).
    """
    import torch

    opt = options or GptqOptions()
    ctx = ctx or null_context()
    ops = _grids(qtype)
    sp = ops.grid_spec(qtype)
    rows, n = (int(s) for s in w.shape)
    dev = w.device
    h_in = h  # the caller's object: the key of a shared factor
    st = gptq_start(w, h, qtype, sp.block)
    w0, h, W, dead, n_dead = st.w0, st.h, st.W, st.dead, st.n_dead
    grid0, codes0 = _search(w0, qtype, imatrix)
    tgrid = _TorchGrid(grid0, dev)
    if backend not in ("auto", "torch"):
        raise QuantizationError(f"Unknown GPTQ back end {backend!r}; use auto or torch.")
    act = opt.act_order
    arrival = opt.scales == "arrival" and not act
    perm = torch.argsort(st.diag, descending=True) if act else None
    del st
    if perm is not None:
        W = W[:, perm]
    hinv, lam, tries = inverse_factor(
        h_in, lambda: working_hessian(h, dead, perm), opt.damp, opt.damp_mode, ("grid", act), factors
    )
    bs = opt.block_size
    if arrival and bs % sp.block:
        bs = max(sp.block, bs // sp.block * sp.block)  # a block's columns must all be current at once
    cols = perm if perm is not None else torch.arange(n, device=dev)
    codes = torch.empty((rows, n), dtype=torch.uint8, device=dev)
    numba = _use_numba(dev, backend)
    inner = _columns_numba if numba else _columns_torch
    with ThreadPoolExecutor(max_workers=2) if numba else contextlib.nullcontext() as pool:
        _sweep(W, hinv, bs, sp, arrival, cols, imatrix, tgrid, codes, inner, pool, ctx)
    del W, hinv

    final = ops.BlockGrid(qtype, tgrid.scale.cpu().numpy(), _np(tgrid.offset), tgrid.template)
    codes_np = codes.cpu().numpy()
    data = ops.encode(final, codes_np)
    return GptqResult(
        data,
        qtype,
        lam,
        n_dead,
        _grid_error(ops, final, codes_np, w0, h),
        _grid_error(ops, grid0, codes0, w0, h),
        gptq_notes(tries, lam, opt.damp, n_dead),
    )


def _grid_error(ops: Any, grid: G.BlockGrid, codes: np.ndarray, w0: Any, h: Any) -> float:
    """``output_error`` of ``codes`` under ``grid`` against ``w0``, decoded a block of rows at a time."""
    import torch

    def values(a: int, b: int) -> Any:
        off = None if grid.offset is None else grid.offset[a:b]
        part = dataclasses.replace(grid, scale=grid.scale[a:b], offset=off, template=grid.template[a:b])
        return torch.as_tensor(ops.values(part, codes[a:b]), device=w0.device)

    return output_error_by_rows(w0, h, values)


def _np(t: Any) -> np.ndarray | None:
    return None if t is None else t.cpu().numpy()


__all__ = [
    "DAMP_MODES",
    "FactorCache",
    "GptqOptions",
    "GptqResult",
    "HessianError",
    "SCALE_MODES",
    "gptq_quantize",
    "inverse_factor",
    "output_error",
    "working_hessian",
]
