"""Budget plans: per-tensor qtypes that minimise the predicted KL within a size, bits-per-weight or memory budget.

The prediction is additive: a plan's KL is the sum of its tensors' KLs from a sensitivity scan
(``studio.core.calib.sensitivity``), each measured with only that tensor quantized. Choosing one
candidate per tensor under a byte limit is a multiple-choice knapsack; it is solved on each tensor's
lower convex hull of (bytes, KL) by the Lagrangian greedy (upgrades in order of KL saved per byte,
which is the LP relaxation's order), then any slack left is spent on the single best jump that
still fits. The candidates are what the scan measured (fallbacks included: a tensor whose rows a
K-quant's super-block does not divide was scanned at llama.cpp's fallback), plus F16 at KL 0.

Budgets (``parse_budget``): file bytes (``105454336``, ``4.5GB``, ``800MiB``), bits per weight of the
tensor data (``4.8bpw``), or run-time memory for a context (``vram=8GB``, ``gpu`` for this GPU's free
memory) through ``studio.core.plan.estimate``'s model of weights + KV cache + overhead. A file budget is
met exactly: the plan's file size is computed as the export writes it (``export_file_bytes``),
header and alignment included, and the limit is tightened until the file fits.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from studio.core import hardware as hardware_module  # tests patch hardware.detect
from studio.core.errors import QuantizationError
from studio.core.gguf.layout import layout
from studio.core.plan.estimate import _overhead, kv_cache_bytes
from studio.core.plan.gguf_file import export_file_bytes
from studio.core.plan.imatrix_need import LLAMA_IMATRIX_TYPES
from studio.core.plan.memory import OVERHEAD_FRACTION
from studio.core.plan.plan import Recipe, RecipeKind, plan_from_preset, plan_from_types
from studio.core.plan.presets import allows_quantization
from studio.core.plan.scan import require_finite, sizes_only
from studio.core.quant.methods import DEFAULT_METHOD
from studio.core.quant.types import tensor_bytes
from studio.core.units import format_bytes

_ALIGN = 32  # GGUF data alignment: every tensor is padded to it
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
MAX_SIZE_BYTES = 1 << 50  # 1 PiB: every size and memory budget is parsed by _size, below this ceiling
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")


class BudgetKind(str, Enum):
    """What a budget limits."""

    FILE = "file"  # the GGUF file's bytes
    BPW = "bpw"  # bits per weight of the tensor data
    MEMORY = "memory"  # llama.cpp's run-time memory (weights, KV cache, overhead) for a context


@dataclass(frozen=True)
class Budget:
    """A budget as the user gave it: ``value`` is bytes (FILE, MEMORY) or bits per weight (BPW)."""

    kind: BudgetKind
    value: float
    text: str
    ctx_len: int = 4096  # MEMORY: the context the KV cache is sized for

    def describe(self) -> str:
        """The budget in words (``105 MB``, ``4.80 bpw``, ``8.00 GB of memory at context 4096``)."""
        if self.kind is BudgetKind.BPW:
            return f"{self.value:.2f} bpw"
        if self.kind is BudgetKind.MEMORY:
            return f"{format_bytes(self.value)} of memory at context {self.ctx_len}"
        return format_bytes(self.value)


def _size(text: str, what: str) -> float:
    m = _SIZE.match(text)
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise QuantizationError(
            f"The {what} {text!r} is not a size; give bytes (105454336), a size with a unit (4.5GB, 800MiB) "
            "or bits per weight (4.8bpw)."
        )
    v = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(v) or v > MAX_SIZE_BYTES:  # 1e400GB is inf; int() of it later overflows
        raise QuantizationError(f"The {what} {text!r} is not a size up to {MAX_SIZE_BYTES >> 50} PiB.")
    return v


def parse_budget(text: str, *, ctx_len: int = 4096, hardware: Any = None) -> Budget:
    """A budget from its text: bytes, ``4.5GB``, ``800MiB``, ``4.8bpw``, ``vram=8GB`` or ``gpu`` (the
    free memory of this machine's GPUs; ``hardware`` is a ``HardwareInfo``, detected when None)."""
    t = str(text).strip()
    low = t.lower()
    if ctx_len < 1:
        raise QuantizationError(f"The context for a memory budget must be at least 1 token, not {ctx_len}.")
    if low.endswith("bpw"):
        try:
            v = float(low[:-3])
        except ValueError:
            raise QuantizationError(
                f"The budget {t!r} is not a number of bits per weight (like 4.8bpw)."
            ) from None
        if not math.isfinite(v) or v <= 0 or v > 64:
            raise QuantizationError(f"A budget of {t} is not a number of bits per weight from 0 to 64.")
        return Budget(BudgetKind.BPW, v, t, ctx_len)
    if low == "gpu":
        if hardware is None:
            hardware = hardware_module.detect()
        if not hardware.gpus:
            raise QuantizationError(
                "No GPU was found to size the plan for.",
                hint="Give the memory yourself, e.g. --budget vram=8GB.",
            )
        return Budget(BudgetKind.MEMORY, float(hardware.gpu_free_bytes), t, ctx_len)
    for prefix in ("vram=", "vram:", "memory=", "memory:"):
        if low.startswith(prefix):
            v = _size(t[len(prefix) :], "memory budget")
            if v <= 0:
                raise QuantizationError(f"A memory budget of {t} is not a positive size.")
            return Budget(BudgetKind.MEMORY, v, t, ctx_len)
    v = _size(t, "budget")
    if not math.isfinite(v) or v <= 0:
        raise QuantizationError(f"A budget of {t} is not a positive size.")
    return Budget(BudgetKind.FILE, v, t, ctx_len)


# ------------------------------------------------------------------------------------------ knapsack


@dataclass(frozen=True)
class Choice:
    """One candidate of one tensor: its qtype, bytes (padded as written) and predicted KL."""

    qtype: str
    bytes: int
    kl: float


def hull(choices: Iterable[Choice]) -> list[Choice]:
    """The lower convex hull of (bytes, KL), smallest first: the only choices a Lagrangian ever takes."""
    pts = sorted(choices, key=lambda c: (c.bytes, c.kl))
    front: list[Choice] = []
    for c in pts:  # Pareto: every larger choice must lower the KL
        if front and c.bytes == front[-1].bytes:
            continue
        if not front or c.kl < front[-1].kl:
            front.append(c)
    out: list[Choice] = []
    for c in front:
        while len(out) >= 2:
            a, b = out[-2], out[-1]
            # b lies on or above the segment a→c: not on the lower hull
            if (b.kl - a.kl) * (c.bytes - a.bytes) >= (c.kl - a.kl) * (b.bytes - a.bytes):
                out.pop()
            else:
                break
        out.append(c)
    return out


def solve(items: Sequence[Sequence[Choice]], limit: int) -> list[Choice] | None:
    """One choice per item with Σ bytes ≤ ``limit`` and a small Σ KL (None when even the smallest
    choices do not fit): the Lagrangian greedy on the hulls, then the best single jump into the slack."""
    hulls = [hull(c) for c in items]
    pos = [0] * len(hulls)
    used = sum(h[0].bytes for h in hulls)
    if used > limit:
        return None
    heap: list[tuple[float, int]] = []

    def push(i: int) -> None:
        h, j = hulls[i], pos[i]
        if j + 1 < len(h):
            db = h[j + 1].bytes - h[j].bytes
            heapq.heappush(heap, (-(h[j].kl - h[j + 1].kl) / db, i))

    for i in range(len(hulls)):
        push(i)
    while heap:
        _, i = heapq.heappop(heap)
        h, j = hulls[i], pos[i]
        step = h[j + 1].bytes - h[j].bytes
        if used + step <= limit:
            used += step
            pos[i] = j + 1
            push(i)
    chosen = [h[p] for h, p in zip(hulls, pos, strict=True)]
    # the slack: any choice of any item (hull or not) that fits and saves the most KL
    slack = limit - used
    best: tuple[float, int, Choice] | None = None
    for i, cands in enumerate(items):
        cur = chosen[i]
        for c in cands:
            if c.bytes - cur.bytes <= slack and c.kl < cur.kl:
                gain = cur.kl - c.kl
                if best is None or gain > best[0]:
                    best = (gain, i, c)
    if best is not None:
        chosen[best[1]] = best[2]
    return chosen


# ------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class CurvePoint:
    """One point of the size/KL front: the plan's file bytes and predicted KL."""

    file_bytes: int
    kl: float
    bpw: float
    label: str = ""


@dataclass(frozen=True)
class Allocation:
    """A budget plan and what it is predicted to cost."""

    plan: Any  # studio.core.plan.plan.Plan
    budget: Budget
    limit_bytes: int  # the bound the plan had to meet, in the budget's own measure (file or memory bytes)
    file_bytes: int  # the exact size of the file the export writes
    tensor_bytes: int
    bpw: float
    memory_bytes: int
    predicted_kl: float  # Σ of the tensors' scanned KLs
    candidates: tuple[str, ...]
    notes: tuple[str, ...] = ()
    measured_kl: float | None = None  # the plan on the scan chunks, every tensor quantized at once

    @property
    def interaction(self) -> float | None:
        """Measured / predicted KL on the scan chunks (above 1: the errors add up super-additively)."""
        if self.measured_kl is None or not self.predicted_kl:
            return None
        return self.measured_kl / self.predicted_kl

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (``plan --json``)."""
        return {
            "budget": {"kind": self.budget.kind.value, "value": self.budget.value, "text": self.budget.text},
            "limit_bytes": self.limit_bytes,
            "file_bytes": self.file_bytes,
            "tensor_bytes": self.tensor_bytes,
            "bpw": round(self.bpw, 4),
            "memory_bytes": self.memory_bytes,
            "predicted_kl": self.predicted_kl,
            "measured_kl": self.measured_kl,
            "candidates": list(self.candidates),
            "notes": list(self.notes),
        }


def _padded(n: int) -> int:
    return n + (-n % _ALIGN)


@dataclass
class _Model:
    """What the allocator needs of a model and its scan."""

    info: Any
    items: list[tuple[str, list[Choice]]]  # scanned tensors in plan order
    fixed: dict[str, str]  # every other exported tensor → its qtype
    fixed_bytes: int  # their padded bytes
    n_weights: int
    f16: dict[str, str] = field(default_factory=dict)


def _model(
    info: Any,
    scan: Any,
    candidates: Sequence[str] | None,
    keep: Mapping[str, str],
    exclude: Collection[str] = (),
) -> _Model:
    allowed = set(candidates) if candidates is not None else None
    by_name = {t.name: t for t in scan.tensors}
    items: list[tuple[str, list[Choice]]] = []
    fixed: dict[str, str] = {}
    fixed_bytes = 0
    n_weights = 0
    f16: dict[str, str] = {}
    for tm in layout(info).tensors:
        n_weights += math.prod(tm.shape)
        quantizable = allows_quantization(tm.gguf_name, len(tm.shape)) and math.prod(tm.shape) > 0
        t = by_name.get(tm.hf_name)
        if quantizable:
            f16[tm.hf_name] = "F16"
        if tm.hf_name in keep:
            q = keep[tm.hf_name]
            fixed[tm.hf_name] = q
            fixed_bytes += _padded(tensor_bytes(q, tm.shape))
            continue
        if t is None or not quantizable:
            q = scan.fixed.get(tm.hf_name, "F32") if quantizable else "F32"
            fixed[tm.hf_name] = q
            fixed_bytes += _padded(tensor_bytes(q, tm.shape))
            continue
        seen: dict[str, Choice] = {}
        for asked, c in t.by_type.items():
            if allowed is not None and asked not in allowed:
                continue
            if c.effective in exclude:  # an excluded type is not taken as another's fallback either
                continue
            if c.effective in seen or not c.usable:  # unusable: its numbers were not finite, even in float64
                continue
            # a NaN cost would pass max() as 0 and make the candidate look free: refused in one sentence
            seen[c.effective] = Choice(c.effective, _padded(c.bytes), max(0.0, require_finite(c, t.name)))
        seen["F16"] = Choice("F16", _padded(tensor_bytes("F16", tm.shape)), 0.0)
        items.append((tm.hf_name, list(seen.values())))
    return _Model(info, items, fixed, fixed_bytes, n_weights, f16)


def _plan_of(m: _Model, chosen: Sequence[Choice], name: str, recipe: Any, notes: Sequence[str]) -> Any:
    types = dict(m.fixed)
    for (tname, _), c in zip(m.items, chosen, strict=True):
        types[tname] = c.qtype
    return plan_from_types(m.info, types, name=name, recipe=recipe, notes=notes)


def _memory_of(info: Any, tensor_total: int, ctx_len: int) -> int:
    n_layers = int(info.n_layers or 0)
    return (
        tensor_total + kv_cache_bytes(info.config, n_layers, ctx_len) + _overhead(tensor_total, info.config)
    )


def _sizes(m: _Model, plan: Any, budget: Budget, imatrix: Any) -> tuple[int, int, int]:
    """(file bytes, tensor bytes, memory bytes) of ``plan``."""
    tensor_total = plan.summary(m.info).total_bytes
    return (
        export_file_bytes(m.info, plan, imatrix=imatrix),
        tensor_total,
        _memory_of(m.info, tensor_total, budget.ctx_len),
    )


def _measure(budget: Budget, file_b: int, tensor_b: int, mem_b: int) -> int:
    return {BudgetKind.FILE: file_b, BudgetKind.MEMORY: mem_b}.get(budget.kind, tensor_b)


def _bound(budget: Budget, m: _Model) -> int:
    """The budget in its own measure: file bytes, memory bytes, or tensor bytes for a bpw budget."""
    if budget.kind is BudgetKind.BPW:
        return int(math.floor(budget.value * m.n_weights / 8))
    return int(math.floor(budget.value))


def _fmt_bound(budget: Budget, n: int, m: _Model) -> str:
    if budget.kind is BudgetKind.BPW:
        return f"{8 * n / m.n_weights:.2f} bpw"
    return format_bytes(n) + (
        f" of memory at context {budget.ctx_len}" if budget.kind is BudgetKind.MEMORY else ""
    )


def allocate(
    info: Any,
    scan: Any,
    budget: Budget,
    *,
    candidates: Sequence[str] | None = None,
    keep: Mapping[str, str] | None = None,
    imatrix: Any = None,
    method: str | None = None,
    exclude: Collection[str] = (),
) -> Allocation:
    """The plan that minimises ``scan``'s predicted KL within ``budget``.

    ``candidates`` limits the qtypes the allocator may choose (default: all the scan measured);
    ``exclude`` removes qtypes even where they are another candidate's fallback (Q5_1 for Q5_K on rows
    a super-block does not divide); ``keep`` pins tensors to qtypes; ``imatrix`` is the one the export will record (its metadata counts
    in the file size); ``method`` is written into the plan (``studio.core.quant.methods``).
    """
    cands = tuple(candidates) if candidates is not None else tuple(scan.types)
    unknown = [q for q in cands if q not in scan.types]
    if unknown:
        raise QuantizationError(
            f"The scan did not measure {unknown[0]}; rescan with it or choose among {', '.join(scan.types)}."
        )
    if method == "rtn" and imatrix is None:
        # an export without an importance matrix cannot write the types that need one (IQ2_XXS, IQ3_XXS ...)
        exclude = frozenset(exclude) | LLAMA_IMATRIX_TYPES
    m = _model(info, scan, cands, dict(keep or {}), frozenset(exclude))
    recipe = Recipe(RecipeKind.BUDGET, budget.text, candidates=cands, method=method or DEFAULT_METHOD)
    bound = _bound(budget, m)
    name = f"budget {budget.text}"
    note = _note(budget, scan)
    smallest = [min(c, key=lambda x: (x.bytes, x.kl)) for _, c in m.items]
    small_plan = _plan_of(m, smallest, name, recipe, (note,))  # the note is in the file: sized with it
    small = _sizes(m, small_plan, budget, imatrix)
    if _measure(budget, *small) > bound:
        raise QuantizationError(
            f"A budget of {budget.describe()} is below what these types allow for {info.path.name}: "
            f"the smallest plan needs {_fmt_bound(budget, _measure(budget, *small), m)}."
        )
    f16_plan = _plan_of(m, [next(c for c in cs if c.qtype == "F16") for _, cs in m.items], name, recipe, ())
    big = _sizes(m, f16_plan, budget, imatrix)
    if _measure(budget, *big) <= bound:
        note = (
            f"The budget of {budget.describe()} is above the F16 file "
            f"({_fmt_bound(budget, _measure(budget, *big), m)}); every tensor stays in F16."
        )
        plan = _plan_of(
            m, [next(c for c in cs if c.qtype == "F16") for _, cs in m.items], name, recipe, (note,)
        )
        return _allocation(m, plan, budget, bound, _sizes(m, plan, budget, imatrix), scan, cands, (note,))
    # the item limit: the bound minus what the rest costs, tightened until the exact size fits
    overhead = _measure(budget, *small) - sum(c.bytes for c in smallest)
    if budget.kind is BudgetKind.MEMORY:
        limit = _memory_limit(m, bound, budget)
    else:
        limit = bound - overhead
    for _ in range(8):
        chosen = solve([c for _, c in m.items], limit)
        assert chosen is not None
        plan = _plan_of(m, chosen, name, recipe, (note,))  # the note is in the file: sized with it
        sizes = _sizes(m, plan, budget, imatrix)
        excess = _measure(budget, *sizes) - bound
        if excess <= 0:
            return _allocation(m, plan, budget, bound, sizes, scan, cands, (note,))
        limit -= excess + _ALIGN
    raise QuantizationError(f"No plan within {budget.describe()} was found for {info.path.name}.")


def _note(budget: Budget, scan: Any) -> str:
    """The note a budget plan carries (in its file's metadata)."""
    return f"Chosen for {budget.describe()} from a {scan.mode} sensitivity scan ({scan.method})."


def check_budget(
    info: Any,
    budget: Budget,
    candidates: Sequence[str],
    *,
    keep: Mapping[str, str] | None = None,
    exclude: Collection[str] = (),
    method: str | None = None,
) -> Allocation | None:
    """Judge ``budget`` before any scan, from the shapes alone: refuse one below the smallest plan of
    ``candidates`` (QuantizationError naming the minimum); return the all-F16 allocation (with its note)
    when the budget holds the F16 file, since no scan can change that plan; None otherwise."""
    sizes = sizes_only(info, candidates)
    alloc = allocate(info, sizes, budget, candidates=candidates, keep=keep, exclude=exclude, method=method)
    # only the above-F16 answer leaves every scanned tensor in F16 (any smaller budget quantizes one)
    return alloc if all(alloc.plan.types.get(t.name) == "F16" for t in sizes.tensors) else None


def _memory_limit(m: _Model, bound: int, budget: Budget) -> int:
    """Item bytes whose plan's memory estimate stays within ``bound`` (the overhead grows with the weights)."""
    base = _memory_of(m.info, 0, budget.ctx_len)
    weights = (bound - base) / (1 + OVERHEAD_FRACTION)
    return int(weights) - m.fixed_bytes


def _allocation(
    m: _Model,
    plan: Any,
    budget: Budget,
    bound: int,
    sizes: tuple[int, int, int],
    scan: Any,
    cands: tuple[str, ...],
    notes: tuple[str, ...],
) -> Allocation:
    file_b, tensor_b, mem_b = sizes
    return Allocation(
        plan,
        budget,
        bound,
        file_b,
        tensor_b,
        8.0 * tensor_b / m.n_weights if m.n_weights else 0.0,
        mem_b,
        scan.predicted_kl(plan.types),
        cands,
        notes,
    )


def pareto_front(
    info: Any,
    scan: Any,
    *,
    candidates: Sequence[str] | None = None,
    points: int = 40,
    keep: Mapping[str, str] | None = None,
    exclude: Collection[str] = (),
    imatrix: Any = None,
    method: str | None = None,
) -> tuple[CurvePoint, ...]:
    """Predicted KL against file size for budgets from the smallest plan to the Q8_0-sized one (the
    header counted as in the smallest plan's file): the curve a budget slider moves along.

    The header is sized as ``allocate`` sizes it for a budget of the point's own byte count (the plan's
    name, recipe and ``method``, and ``imatrix``'s metadata), so every point, the smallest included, is
    a budget ``allocate`` accepts."""
    cands = tuple(candidates) if candidates is not None else tuple(scan.types)
    m = _model(info, scan, cands, dict(keep or {}), frozenset(exclude))
    smallest = [min(c, key=lambda x: (x.bytes, x.kl)) for _, c in m.items]
    lo = sum(c.bytes for c in smallest)
    size = export_file_bytes(info, _plan_of(m, smallest, "smallest", None, ()), imatrix=imatrix)
    for _ in range(4):  # the budget's text is its byte count: size the header until they agree
        budget = parse_budget(str(size))
        recipe = Recipe(RecipeKind.BUDGET, budget.text, candidates=cands, method=method or DEFAULT_METHOD)
        plan = _plan_of(m, smallest, f"budget {budget.text}", recipe, (_note(budget, scan),))
        again = export_file_bytes(info, plan, imatrix=imatrix)
        if again <= size:
            break
        size = again
    overhead = size - lo
    hi = sum(max((x for x in c if x.qtype != "F16"), key=lambda x: x.bytes).bytes for _, c in m.items)
    out = []
    for k in range(points):
        limit = int(lo + (hi - lo) * k / max(1, points - 1))
        chosen = solve([c for _, c in m.items], limit)
        if chosen is None:
            continue
        items = sum(c.bytes for c in chosen)
        kl = sum(c.kl for c in chosen)
        out.append(CurvePoint(items + overhead, kl, 8.0 * (items + m.fixed_bytes) / m.n_weights))
    return tuple(out)


def preset_points(
    info: Any, scan: Any, presets: Sequence[str], *, imatrix: bool = True
) -> tuple[CurvePoint, ...]:
    """llama.cpp's presets on the same axes: their exact file size and the KL the scan predicts for them."""
    out = []
    for p in presets:
        plan = plan_from_preset(info, p, imatrix=imatrix)
        try:
            kl = scan.predicted_kl(plan.types)
        except KeyError:
            continue  # a type the scan did not measure
        s = plan.summary(info)
        out.append(CurvePoint(export_file_bytes(info, plan), kl, s.bpw, p))
    return tuple(out)


__all__ = [
    "Allocation",
    "Budget",
    "BudgetKind",
    "Choice",
    "CurvePoint",
    "allocate",
    "check_budget",
    "hull",
    "pareto_front",
    "parse_budget",
    "preset_points",
    "solve",
]
