"""The record of a sensitivity scan: per tensor and candidate qtype, the KL and the bytes.

``studio.core.calib.sensitivity`` measures it; the budget planner (``allocate``) reads it. The
targets a scan covers and a scan of sizes alone (every KL 0, no model run) are decided here, from
the layout and the presets, so a plan can be judged before any scan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from studio.core.errors import CalibrationError, QuantizationError, StudioError
from studio.core.gguf.layout import layout
from studio.core.plan.presets import allows_quantization
from studio.core.quant.types import QTYPES, fallback_type, tensor_bytes

SCAN_VERSION = 2  # 2: candidates carry ``unusable`` (scans of version 1 may hold NaN costs)
# Ceilings for the counts a scan file carries (issue 39: every number read from a file is range-checked):
# far above any real model, low enough that sums and float conversions of them stay exact and finite.
_MAX_BYTES = 2**50  # a tensor's bytes (1 PiB)
_MAX_PARAMS = 2**48
_MAX_LAYER = 10_000
_MAX_TOKENS = 10**12


def _count(value: Any, what: str, ceiling: int) -> int:
    """``value`` as a whole number in 0..ceiling (ValueError naming ``what`` otherwise)."""
    n = int(value)
    if not 0 <= n <= ceiling:
        raise ValueError(f"{what} {n if abs(n) < 10**30 else '(huge)'} is outside 0..{ceiling:,}")
    return n


"""Bump when the scan record's JSON changes, so a stale cached scan is not read."""

LOW_BIT_SCAN_TYPES: tuple[str, ...] = tuple(
    q
    for q in (
        "IQ3_S",
        "IQ3_XXS",
        "IQ2_S",
        "IQ2_XS",
        "IQ2_XXS",
        "IQ1_M",
        "IQ1_S",
        "MXFP4",
        "Q2_0",
        "TQ2_0",
        "TQ1_0",
        "Q1_0",
    )
    if q in QTYPES
)
"""The low-bit types llama-quantize writes, which a scan measures beside the K-quants and the 32-weight
types (a scan always has its importance matrix, which the i-quants need), so budget plans may choose them."""

TRAINED_ONLY_TYPES: tuple[str, ...] = tuple(q for q in ("TQ1_0", "TQ2_0", "Q1_0", "Q2_0") if q in QTYPES)
"""Types for weights trained for them (ternary, 1- and 2-bit): on a model trained in float they destroy
it (llama.cpp's own Q2_0 preset on SmolLM2-135M: KLD 12.4 nats), so a budget's menu takes them only when
the user names them or the model's metadata says it was trained for them (``plan.menu``)."""


class Mode(str):
    """Scan modes (plain strings so that JSON and the CLI read them as they are)."""

    EXACT = "exact"
    PROXY = "proxy"


@dataclass(frozen=True)
class TypeCost:
    """One candidate of one tensor: the KL when only this tensor takes ``qtype``, and its bytes.

    ``effective`` is the qtype the tensor really gets (a fallback when its rows do not fit the
    block); ``measured`` tells an exact KL from a proxy prediction; ``error`` is the imatrix-weighted
    quantization error (None when it was not computed); ``unusable`` says why a candidate whose numbers
    are not finite (even measured again in float64) may not be chosen ("" for a usable one).
    """

    qtype: str
    kl: float
    bytes: int
    effective: str
    measured: bool
    error: float | None = None
    unusable: str = ""

    @property
    def usable(self) -> bool:
        """Whether a plan may choose this candidate."""
        return not self.unusable


@dataclass(frozen=True)
class TensorSensitivity:
    """The candidates of one quantizable tensor."""

    name: str  # HF name (as plans key tensors)
    gguf_name: str
    role: str
    layer: int | None
    n_params: int
    by_type: Mapping[str, TypeCost]

    def cost(self, qtype: str) -> TypeCost:
        """The candidate ``qtype`` (KeyError when it was not scanned)."""
        return self.by_type[qtype]


@dataclass(frozen=True)
class ProxyCheck:
    """How the proxy compares with the exact KL on held-out (tensor, qtype) pairs."""

    pairs: tuple[tuple[str, str, float, float], ...]  # (tensor, qtype, exact KL, proxy KL)

    @property
    def median_abs_log_ratio(self) -> float:
        """Median |ln(proxy / exact)| (0 is perfect; 0.26 is a factor 1.3)."""
        r = [abs(math.log(p / e)) for _, _, e, p in self.pairs if e > 0 and p > 0]
        return float(np.median(r)) if r else float("nan")

    @property
    def spearman(self) -> float:
        """Rank correlation of proxy and exact KL over the pairs."""
        if len(self.pairs) < 3:
            return float("nan")
        e = np.argsort(np.argsort([p[2] for p in self.pairs]))
        q = np.argsort(np.argsort([p[3] for p in self.pairs]))
        return float(np.corrcoef(e, q)[0, 1])


def _rotation_seed(value: Any) -> int | None:
    """The seed a scan file's ``rotation`` records (None: scanned unrotated); ValueError if it is not one."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError("its rotation is not an object")
    return _count(value["seed"], "a rotation seed", 2**32 - 1)


@dataclass(frozen=True)
class Sensitivity:
    """A scan of one model: the candidates of every quantizable tensor, and how they were measured."""

    model: str
    dataset: str
    mode: str
    method: str  # how candidates were quantized ("imatrix": llama.cpp's search with the imatrix)
    types: tuple[str, ...]
    n_tokens: int
    tensors: tuple[TensorSensitivity, ...]
    fixed: Mapping[str, str] = field(default_factory=dict)  # quantizable tensors not scanned → qtype kept
    plan_kls: tuple[float, ...] = ()  # measured KL of each plan given to the scan
    check: ProxyCheck | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    key: str = ""
    rotation: int | None = None  # the seed of the rotation the model was scanned under (export --rotate)

    def tensor(self, name: str) -> TensorSensitivity:
        """The tensor called ``name`` (HF or GGUF name); KeyError if it was not scanned."""
        for t in self.tensors:
            if name in (t.name, t.gguf_name):
                return t
        raise KeyError(name)

    def predicted_kl(self, types: Mapping[str, str]) -> float:
        """The sum of the tensors' KLs at ``types`` (HF name → qtype; float types count 0)."""
        total = 0.0
        for t in self.tensors:
            q = types.get(t.name)
            if q is None or QTYPES[q].is_float:
                continue
            c = t.by_type.get(q)
            if c is None:
                c = next((v for v in t.by_type.values() if v.effective == q), None)
            if c is None:
                raise KeyError(f"{t.name} was not scanned at {q}")
            total += require_finite(c, t.name)
        return total

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``sensitivity --json``): ``{"tensors": [{"name", "role", "layer", "by_type":
        {TYPE: {"kl", "bytes", ...}}}], ...}``."""
        out: dict[str, Any] = {
            "version": SCAN_VERSION,
            "model": self.model,
            "dataset": self.dataset,
            "mode": self.mode,
            "method": self.method,
            "types": list(self.types),
            "tokens": self.n_tokens,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "key": self.key,
            "tensors": [
                {
                    "name": t.name,
                    "gguf_name": t.gguf_name,
                    "role": t.role,
                    "layer": t.layer,
                    "params": t.n_params,
                    "by_type": {
                        q: {
                            "kl": c.kl,
                            "bytes": c.bytes,
                            "effective": c.effective,
                            "measured": c.measured,
                            "error": c.error,
                            **({"unusable": c.unusable} if c.unusable else {}),
                        }
                        for q, c in t.by_type.items()
                    },
                }
                for t in self.tensors
            ],
            "fixed": dict(self.fixed),
            "plan_kls": list(self.plan_kls),
        }
        if self.rotation is not None:  # written only for a rotated scan: older readers see the same file
            out["rotation"] = {"seed": self.rotation}
        if self.check is not None:
            out["check"] = {
                "pairs": [list(p) for p in self.check.pairs],
                "median_abs_log_ratio": self.check.median_abs_log_ratio,
                "spearman": self.check.spearman,
            }
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Sensitivity:
        """A scan as ``to_dict`` wrote it; CalibrationError if it is not one."""
        try:
            if d.get("version") != SCAN_VERSION:
                raise ValueError(f"version {d.get('version')!r}")
            tensors = tuple(
                TensorSensitivity(
                    str(t["name"]),
                    str(t["gguf_name"]),
                    str(t["role"]),
                    None if t["layer"] is None else _count(t["layer"], "a layer", _MAX_LAYER),
                    _count(t["params"], "a parameter count", _MAX_PARAMS),
                    {
                        str(q): TypeCost(
                            str(q),
                            float(c["kl"]),
                            _count(c["bytes"], "a byte count", _MAX_BYTES),
                            str(c["effective"]),
                            bool(c["measured"]),
                            None if c.get("error") is None else float(c["error"]),
                            str(c.get("unusable") or ""),
                        )
                        for q, c in t["by_type"].items()
                    },
                )
                for t in d["tensors"]
            )
            chk = d.get("check")
            check = (
                ProxyCheck(tuple((str(a), str(b), float(c), float(e)) for a, b, c, e in chk["pairs"]))
                if chk
                else None
            )
            return Sensitivity(
                str(d["model"]),
                str(d["dataset"]),
                str(d["mode"]),
                str(d["method"]),
                tuple(str(x) for x in d["types"]),
                _count(d["tokens"], "the token count", _MAX_TOKENS),
                tensors,
                {str(k): str(v) for k, v in (d.get("fixed") or {}).items()},
                tuple(float(x) for x in d.get("plan_kls") or ()),
                check,
                float(d.get("seconds", 0.0)),
                float(d.get("cpu_seconds", 0.0)),
                str(d.get("key", "")),
                _rotation_seed(d.get("rotation")),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
            raise CalibrationError(f"This is not a sensitivity scan of Quant Studio ({err}).") from None

    def non_finite(self) -> tuple[str, str] | None:
        """The first usable candidate (tensor, qtype) whose KL or error is not finite (None: all are)."""
        for t in self.tensors:
            for q, c in t.by_type.items():
                if c.usable and not (math.isfinite(c.kl) and (c.error is None or math.isfinite(c.error))):
                    return t.name, q
        return None

    @property
    def nbytes(self) -> int:
        """Memory held (for cache budgets)."""
        return 512 + sum(256 + 96 * len(t.by_type) for t in self.tensors)


def require_finite(cost: TypeCost, tensor: str) -> float:
    """``cost``'s KL, or QuantizationError in one sentence naming the tensor and type when it is unusable
    or not finite (a NaN taken as a cost would make the candidate look free)."""
    if cost.unusable:
        raise QuantizationError(f"{tensor} at {cost.qtype} cannot be used: {cost.unusable}.")
    if not math.isfinite(cost.kl):
        raise QuantizationError(
            f"The scan's KL for {tensor} at {cost.qtype} is {cost.kl}, not a finite cost; rescan the model."
        )
    return cost.kl


# ------------------------------------------------------------------------------------------ targets


@dataclass(frozen=True)
class ScanTarget:
    """A quantizable tensor the scan can perturb: where it sits in the run, and its candidates."""

    name: str
    gguf_name: str
    role: str
    layer: int | None
    shape: tuple[int, ...]  # GGUF numpy shape (rows × n_per_row)
    candidates: Mapping[str, str]  # asked qtype → effective qtype
    kind: str  # "linear" (a site in a layer), "embedding" or "output"

    @property
    def effective(self) -> tuple[str, ...]:
        """The distinct effective qtypes, smallest first."""
        eff = set(self.candidates.values())
        return tuple(sorted(eff, key=lambda q: (tensor_bytes(q, self.shape), q)))


def scan_targets(info: Any, types: Sequence[str]) -> tuple[list[ScanTarget], dict[str, str]]:
    """The tensors a scan covers (HF order) and the quantizable ones it cannot perturb (→ Q8_0)."""
    lay = layout(info)
    roles = {t.name: t.role.value for t in info.tensors}
    out: list[ScanTarget] = []
    fixed: dict[str, str] = {}
    for tm in lay.tensors:
        if not allows_quantization(tm.gguf_name, len(tm.shape)) or math.prod(tm.shape) == 0:
            continue
        cands = {q: fallback_type(q, tm.n_per_row).qtype for q in types}
        cands = {q: e for q, e in cands.items() if not QTYPES[e].is_float}
        role = roles.get(tm.hf_name, "unknown")
        if tm.gguf_name == "token_embd.weight":
            kind = "embedding"
        elif tm.gguf_name == "output.weight":
            kind = "output"
        elif tm.layer is not None:
            kind = "linear"
        else:
            fixed[tm.hf_name] = fallback_type("Q8_0", tm.n_per_row).qtype
            continue
        if kind != "linear":
            # llama-imatrix collects no importance for the token embedding (nor, by default, the output):
            # the types ggml refuses without one (IQ2_XXS, IQ2_XS, IQ1_S) are no candidates there
            cands = {q: e for q, e in cands.items() if not QTYPES[e].needs_imatrix}
        if not cands:
            fixed[tm.hf_name] = "F16"
            continue
        out.append(ScanTarget(tm.hf_name, tm.gguf_name, role, tm.layer, tm.shape, cands, kind))
    return out, fixed


def stored_narrow_head(info: Any) -> bool:
    """Whether the model of ``info`` stores an untied output head in bfloat16 or float16, which the scan's
    finish holds as stored instead of in float32 (``runner.OuterView.stored``; the estimates count it so)."""
    try:
        tensors = layout(info).tensors
    except StudioError:  # an architecture the exporter does not map: counted in float32
        return False
    for tm in tensors:
        if tm.gguf_name == "output.weight":
            try:
                return str(info.tensor(tm.hf_name).dtype) in ("BF16", "F16")
            except KeyError:
                return False
    return False


def sizes_only(info: Any, types: Sequence[str]) -> Sensitivity:
    """A scan with every KL 0: the candidates' bytes without running the model (what a budget's range
    needs, so that a budget no plan can meet is refused before any scan)."""
    targets, fixed = scan_targets(info, types)
    tensors = tuple(
        TensorSensitivity(
            t.name,
            t.gguf_name,
            t.role,
            t.layer,
            math.prod(t.shape),
            {q: TypeCost(q, 0.0, tensor_bytes(e, t.shape), e, False) for q, e in t.candidates.items()},
        )
        for t in targets
    )
    return Sensitivity(str(info.path), "", "sizes", "", tuple(types), 0, tensors, fixed)


__all__ = [
    "LOW_BIT_SCAN_TYPES",
    "SCAN_VERSION",
    "TRAINED_ONLY_TYPES",
    "Mode",
    "ProxyCheck",
    "ScanTarget",
    "Sensitivity",
    "TensorSensitivity",
    "TypeCost",
    "require_finite",
    "scan_targets",
    "sizes_only",
    "stored_narrow_head",
]
