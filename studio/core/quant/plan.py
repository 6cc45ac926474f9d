"""A plan maps every tensor of a model to a GGUF type; presets and recipes make plans.

Plans are keyed by Hugging Face tensor names (what the rest of the studio shows); the decisions
that depend on llama.cpp's naming (output/token_embd, attn_v, ...) are taken on the GGUF name.
Fallbacks for rows a type cannot split are applied when the plan is made and listed in it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from studio.core.errors import QuantizationError
from studio.core.jobs import JobContext
from studio.core.model.types import ModelInfo
from studio.core.quant.presets import PRESETS, Fallback, allows_quantization, preset_choice
from studio.core.quant.types import FLOAT_TYPES, QTYPES, check_type, fallback_type, tensor_bytes

PLAN_VERSION = 1

@dataclass(frozen=True)
class Override:
    """Tensors whose HF or GGUF name matches ``pattern`` (re.search) get ``qtype``."""

    pattern: str
    qtype: str


@dataclass(frozen=True)
class PlanSummary:
    """Size of a plan's output: bytes of tensor data, bits per weight, tensors per type."""

    total_bytes: int
    parameters: int
    bpw: float
    tensors_by_type: Mapping[str, int]
    bytes_by_type: Mapping[str, int]


@dataclass(frozen=True)
class Plan:
    """Tensor name (HF) → GGUF type, with how it was made and the fallbacks applied."""

    types: Mapping[str, str]
    name: str = "custom"
    ftype: int = 1
    fallbacks: tuple[Fallback, ...] = ()
    notes: tuple[str, ...] = ()
    recipe: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # freeze the mappings so a Plan can be shared between threads safely
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))
        object.__setattr__(self, "recipe", MappingProxyType(dict(self.recipe)))
        for name, t in self.types.items():
            check_type(t, f"Plan gives tensor {name!r} the unknown type {t!r}.")

    def type_of(self, name: str) -> str:
        """The GGUF type of tensor ``name``; QuantizationError if the plan does not cover it."""
        try:
            return self.types[name]
        except KeyError:
            raise QuantizationError(
                f"The plan {self.name!r} has no type for tensor {name!r}.",
                hint="Make the plan for this model.",
            ) from None

    def to_json(self) -> str:
        """The plan as JSON text (with a ``version`` field)."""
        return json.dumps(self.to_dict(), indent=1)

    def to_dict(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict."""
        return {
            "version": PLAN_VERSION,
            "name": self.name,
            "ftype": self.ftype,
            "recipe": _jsonable(dict(self.recipe)),
            "types": dict(self.types),
            "fallbacks": [f.to_dict() for f in self.fallbacks],
            "notes": list(self.notes),
        }

    @staticmethod
    def from_json(text: str, info: ModelInfo | None = None, source: str | None = None) -> Plan:
        """A plan from JSON text; with ``info``, checked against that model's tensors.

        ``source`` (the file name) is named in the error messages.
        """
        what = f"The plan file {source}" if source else "The plan file"
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise QuantizationError(f"{what} is not valid JSON ({err.msg} at line {err.lineno}).") from None
        return Plan.from_dict(d, info, source)

    @staticmethod
    def from_dict(d: Any, info: ModelInfo | None = None, source: str | None = None) -> Plan:
        """A plan from a dict as written by ``to_dict``; ``source`` is named in error messages."""
        what = f"The plan file {source}" if source else "The plan file"
        if not isinstance(d, dict) or "version" not in d:
            raise QuantizationError(f"{what} has no 'version' field; it is not a Quant Studio plan.")
        if d["version"] != PLAN_VERSION:
            raise QuantizationError(
                f"{what} has version {d['version']!r}; this Quant Studio reads version {PLAN_VERSION}."
            )
        types = d.get("types")
        recipe = d.get("recipe") or {}
        if not isinstance(types, dict) or not types:
            if info is not None and isinstance(recipe, dict) and recipe:
                return plan_from_recipe(info, recipe)
            raise QuantizationError(f"{what} has no 'types' table.")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in types.items()):
            raise QuantizationError(f"{what}: its 'types' table must map tensor names to type names.")
        try:
            fallbacks = tuple(
                Fallback(
                    str(f["tensor"]), str(f["gguf_name"]), str(f["wanted"]), str(f["got"]), str(f["reason"])
                )
                for f in d.get("fallbacks") or []
            )
            plan = Plan(
                types=types,
                name=str(d.get("name", "custom")),
                ftype=int(d.get("ftype", 1)),
                fallbacks=fallbacks,
                notes=tuple(str(n) for n in d.get("notes") or []),
                recipe=recipe if isinstance(recipe, dict) else {},
            )
        except (KeyError, TypeError, ValueError) as err:
            # a hand-edited file: its 'fallbacks', 'ftype' or 'notes' are not what to_dict writes
            raise QuantizationError(f"{what} is malformed ({type(err).__name__}: {err}).") from None
        if info is not None:
            check_plan(plan, info)
        return plan

    def summary(self, info: ModelInfo) -> PlanSummary:
        """Bytes, bits per weight and tensor counts of this plan's output for ``info``."""
        from studio.core.gguf.arch import layout

        total = params = 0
        by_type: dict[str, int] = {}
        bytes_by: dict[str, int] = {}
        for tm in layout(info).tensors:
            t = self.types.get(tm.hf_name, "F32")
            nb = tensor_bytes(t, tm.shape)
            total += nb
            params += math.prod(tm.shape)
            by_type[t] = by_type.get(t, 0) + 1
            bytes_by[t] = bytes_by.get(t, 0) + nb
        return PlanSummary(
            total,
            params,
            8.0 * total / params if params else 0.0,
            MappingProxyType(by_type),
            MappingProxyType(bytes_by),
        )


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


def check_plan(plan: Plan, info: ModelInfo) -> None:
    """Raise QuantizationError unless ``plan`` covers exactly the tensors exported for ``info``
    with types their rows allow."""
    from studio.core.gguf.arch import layout

    lay = layout(info)
    for tm in lay.tensors:
        if tm.hf_name not in plan.types:
            raise QuantizationError(
                f"The plan {plan.name!r} has no type for tensor {tm.hf_name!r} of {info.path}.",
                hint="The plan was probably made for another model; make a new one.",
            )
        t = plan.types[tm.hf_name]
        if t not in FLOAT_TYPES:
            if not allows_quantization(tm.gguf_name, len(tm.shape)):
                raise QuantizationError(
                    f"Tensor {tm.hf_name!r} ({tm.gguf_name}) must stay F32, the plan says {t}."
                )
            got, why = fallback_type(t, tm.n_per_row)
            if why is not None:
                raise QuantizationError(
                    f"Tensor {tm.hf_name!r} cannot be {t}: {why}.",
                    hint=f"Use {got} for it, or remake the plan.",
                )
    known = {tm.hf_name for tm in lay.tensors}
    extra = [n for n in plan.types if n not in known]
    if extra:
        raise QuantizationError(
            f"The plan {plan.name!r} names tensor {extra[0]!r}, which {info.path} does not export.",
            hint="The plan was probably made for another model.",
        )


def _finish(
    info: ModelInfo,
    wanted: dict[str, str],
    *,
    name: str,
    ftype: int,
    overrides: Sequence[Override],
    recipe: dict[str, Any],
    fallbacks: Iterable[Fallback] = (),
) -> Plan:
    """Apply overrides (first match wins), keep non-quantizable tensors F32, apply fallbacks."""
    from studio.core.gguf.arch import layout

    compiled = []
    for o in overrides:
        check_type(o.qtype, f"Override {o.pattern!r} asks for the unknown type {o.qtype!r}.")
        try:
            compiled.append((re.compile(o.pattern), o.qtype))
        except re.error as err:
            raise QuantizationError(f"Override pattern {o.pattern!r} is not a valid regex ({err}).") from None
    types: dict[str, str] = {}
    fbs = list(fallbacks)
    notes: list[str] = []
    for tm in layout(info).tensors:
        if not allows_quantization(tm.gguf_name, len(tm.shape)) or math.prod(tm.shape) == 0:
            if tm.shape and math.prod(tm.shape) == 0:
                notes.append(f"{tm.hf_name} is empty and is kept in F32.")
            types[tm.hf_name] = "F32"
            continue
        t = wanted[tm.hf_name]
        for rx, qt in compiled:
            if rx.search(tm.hf_name) or rx.search(tm.gguf_name):
                t = qt
                break
        got, why = fallback_type(t, tm.n_per_row)
        if why is not None and not any(f.tensor == tm.hf_name for f in fbs):
            fbs.append(Fallback(tm.hf_name, tm.gguf_name, t, got, why))
        types[tm.hf_name] = got
    # a fallback recorded upstream stays listed only if the tensor really ended up there
    fbs = [f for f in fbs if types.get(f.tensor) == f.got]
    rec = dict(recipe)
    if overrides:
        rec["overrides"] = [[o.pattern, o.qtype] for o in overrides]
    return Plan(types, name=name, ftype=ftype, fallbacks=tuple(fbs), notes=tuple(notes), recipe=rec)


def plan_from_preset(
    info: ModelInfo, preset: str, overrides: Sequence[Override] = (), *, imatrix: bool = False
) -> Plan:
    """The plan llama.cpp's ``preset`` (e.g. "Q4_K_M") makes for this model, plus overrides;
    ``imatrix``: the export will use an importance matrix (llama.cpp then guards a few tensors)."""
    choice = preset_choice(info, preset, imatrix=imatrix)
    p = PRESETS[choice.preset]
    return _finish(
        info,
        choice.types,
        name=p.name,
        ftype=p.ftype,
        overrides=overrides,
        recipe={"kind": "preset", "preset": p.name, **({"imatrix": True} if imatrix else {})},
        fallbacks=choice.fallbacks,
    )


def plan_uniform(info: ModelInfo, qtype: str, overrides: Sequence[Override] = ()) -> Plan:
    """Every quantizable tensor at ``qtype`` (e.g. Q8_0 for INT8, Q4_K or Q4_0 for INT4)."""
    from studio.core.gguf.arch import layout

    qtype = check_type(qtype.upper())
    wanted = {tm.hf_name: qtype for tm in layout(info).tensors}
    return _finish(
        info,
        wanted,
        name=f"uniform {qtype}",
        ftype=QTYPES[qtype].ftype or 1,
        overrides=overrides,
        recipe={"kind": "uniform", "type": qtype},
    )


def plan_first_last(info: ModelInfo, n: int, high: str, low: str, overrides: Sequence[Override] = ()) -> Plan:
    """The first and last ``n`` layers (and the embeddings and output, which are as sensitive)
    at ``high``; every other quantizable tensor at ``low``."""
    from studio.core.gguf.arch import layout

    high, low = check_type(high.upper()), check_type(low.upper())
    if n < 0:
        raise QuantizationError(f"The number of first/last layers must be 0 or more, not {n}.")
    lay = layout(info)
    n_layers = max([t.layer + 1 for t in lay.tensors if t.layer is not None], default=0)
    wanted = {}
    for tm in lay.tensors:
        if tm.layer is None:
            wanted[tm.hf_name] = high
        else:
            wanted[tm.hf_name] = high if tm.layer < n or tm.layer >= n_layers - n else low
    return _finish(
        info,
        wanted,
        name=f"first/last {n} at {high}, rest {low}",
        ftype=QTYPES[low].ftype or 1,
        overrides=overrides,
        recipe={"kind": "first_last", "n": n, "high": high, "low": low},
    )


def plan_from_recipe(info: ModelInfo, recipe: Mapping[str, Any]) -> Plan:
    """Remake a plan for ``info`` from its recipe (what ``Plan.recipe`` records)."""
    kind = recipe.get("kind")
    try:
        ovs = tuple(Override(str(p), str(t)) for p, t in recipe.get("overrides") or [])
        if kind == "preset":
            return plan_from_preset(info, str(recipe["preset"]), ovs, imatrix=bool(recipe.get("imatrix")))
        if kind == "uniform":
            return plan_uniform(info, str(recipe["type"]), ovs)
        if kind == "first_last":
            return plan_first_last(info, int(recipe["n"]), str(recipe["high"]), str(recipe["low"]), ovs)
    except (KeyError, TypeError, ValueError) as err:
        raise QuantizationError(
            f"The plan recipe {kind!r} is malformed ({type(err).__name__}: {err})."
        ) from None
    raise QuantizationError(f"The plan recipe kind {kind!r} is unknown.")


def with_overrides(plan: Plan, info: ModelInfo, overrides: Sequence[Override]) -> Plan:
    """``plan`` with ``overrides`` applied on top (first match wins), fallbacks recomputed."""
    kept = [f for f in plan.fallbacks if not any(re.search(o.pattern, f.tensor) for o in overrides)]
    return _finish(
        info,
        dict(plan.types),
        name=plan.name + " + overrides",
        ftype=plan.ftype,
        overrides=overrides,
        recipe=dict(plan.recipe),
        fallbacks=kept,
    )


@dataclass(frozen=True)
class NonFinite:
    """A tensor holding NaN or Inf values."""

    tensor: str
    nan: int
    inf: int


def count_nonfinite(x: np.ndarray) -> tuple[int, int]:
    """(number of NaN, number of ±Inf) in ``x``."""
    if x.dtype.kind != "f" or x.size == 0:
        return 0, 0
    nan = int(np.count_nonzero(np.isnan(x)))
    inf = int(np.count_nonzero(np.isinf(x)))
    return nan, inf


def nonfinite_error(name: str, nan: int, inf: int, path: Any = None) -> QuantizationError:
    """The error for a tensor with NaN/Inf values (FAULTS 19)."""
    where = f" of {path}" if path is not None else ""
    return QuantizationError(
        f"Tensor {name!r}{where} contains {nan} NaN and {inf} Inf values; refusing to quantize it.",
        hint="The checkpoint is damaged or was saved after a diverged step; fix or re-download it.",
    )


def scan_nonfinite(
    checkpoint: Any, names: Iterable[str] | None = None, ctx: JobContext | None = None
) -> list[NonFinite]:
    """Read every (or the named) tensor of an opened checkpoint and list those with NaN/Inf."""
    names = list(names) if names is not None else [t.name for t in checkpoint.info.tensors]
    bad: list[NonFinite] = []
    for i, name in enumerate(names):
        if ctx is not None:
            ctx.check_cancelled()
            ctx.report(i, len(names), f"scanning {name}")
        nan, inf = count_nonfinite(np.asarray(checkpoint.read(name)))
        if nan or inf:
            bad.append(NonFinite(name, nan, inf))
    if ctx is not None:
        ctx.report(len(names), len(names), "scan done")
    return bad
