"""A plan gives every tensor of a model a qtype; presets make plans and the plan verbs change them.

Plans are keyed by Hugging Face tensor names (what the rest of the studio shows); the decisions
that depend on llama.cpp's naming (output/token_embd, attn_v, ...) are taken on the GGUF name.
Fallbacks for rows a qtype cannot split are applied whenever a plan is made or changed, and listed.

A plan starts from a preset (``plan_from_preset``) or one qtype everywhere (``plan_uniform``); the
plan verbs below are the only way to change one, and both the CLI and the GUI's plan editor call
them, so an edit means the same everywhere:

``with_types(plan, info, changes)``
    The named tensors asked to take new qtypes (the plan editor's cells).
``keep_first_last(plan, info, n, qtype)``
    The first and last ``n`` decoder layers at ``qtype``, and with them the tensors outside the
    layers (token embeddings, output), which are as sensitive; every other tensor keeps its qtype.
``with_overrides(plan, info, overrides)``
    Regular expressions on HF or GGUF names give matching tensors a qtype; the first match wins.
``with_method(plan, info, method, tensors=None)``
    How codes and scales are chosen (``studio.core.quant.methods``: rtn, imatrix, gptq, awq,
    awq+gptq): the plan-wide default, or for the named tensors only.

Tensors llama.cpp never quantizes (norms, 1-D tensors) stay F32 whatever a verb asks. Each plan
carries its ``Recipe`` (how it was made), so a saved plan can be remade for another model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

from studio.core import safejson
from studio.core.errors import QuantizationError, quote
from studio.core.gguf.layout import layout
from studio.core.modelinfo import ModelInfo
from studio.core.plan.presets import PRESETS, Fallback, allows_quantization, preset_choice
from studio.core.quant.methods import DEFAULT_METHOD, check_method, method_info
from studio.core.quant.types import FLOAT_TYPES, QTYPES, check_type, fallback_type, tensor_bytes
from studio.core.saferegex import compile_pattern

PLAN_VERSION = 1
MAX_FTYPE = 1024  # llama.cpp's LLAMA_FTYPE_GUESSED; general.file_type is a u32 of a small enum
MAX_FIRST_LAST = 1 << 20  # first/last layers: more than any model has, far less than a loop can bear


@dataclass(frozen=True)
class Override:
    """Tensors whose HF or GGUF name matches ``pattern`` (re.search) get ``qtype``."""

    pattern: str
    qtype: str


class RecipeKind(str, Enum):
    """What a plan starts from."""

    PRESET = "preset"  # one of llama.cpp's mixtures
    UNIFORM = "uniform"  # one qtype for every quantizable tensor
    BUDGET = "budget"  # chosen per tensor from a sensitivity scan for a size budget


@dataclass(frozen=True)
class Recipe:
    """How a plan was made: its start, then the verbs applied (first/last layers, then overrides).

    ``edited``: the plan was also changed in ways a recipe does not record (cells set by hand, or
    verbs in another order), so remaking it from the recipe gives the plan before those changes.
    """

    kind: RecipeKind
    base: str  # the preset (PRESET), the qtype (UNIFORM) or the budget as written (BUDGET, "4.8bpw")
    imatrix: bool = False  # PRESET: made for an export with an importance matrix
    keep_first_last: tuple[int, str] | None = None  # (n, qtype)
    overrides: tuple[Override, ...] = ()
    edited: bool = False
    method: str = DEFAULT_METHOD  # the plan-wide method (``with_method``), applied last
    candidates: tuple[str, ...] = ()  # BUDGET: the qtypes the allocator could choose from

    def to_dict(self) -> dict[str, Any]:
        """The recipe as saved in plan files (a uniform start with first/last layers is written as
        the ``first_last`` kind, the form plans have always used for it)."""
        if self.kind is RecipeKind.UNIFORM and self.keep_first_last is not None:
            n, high = self.keep_first_last
            d: dict[str, Any] = {"kind": "first_last", "n": n, "high": high, "low": self.base}
        elif self.kind is RecipeKind.UNIFORM:
            d = {"kind": "uniform", "type": self.base}
        elif self.kind is RecipeKind.BUDGET:
            d = {"kind": "budget", "budget": self.base, "candidates": list(self.candidates)}
        else:
            d = {"kind": "preset", "preset": self.base}
            if self.imatrix:
                d["imatrix"] = True
            if self.keep_first_last is not None:
                n, qtype = self.keep_first_last
                d["keep_first_last"] = {"n": n, "type": qtype}
        if self.overrides:
            d["overrides"] = [[o.pattern, o.qtype] for o in self.overrides]
        if self.method != DEFAULT_METHOD:
            d["method"] = self.method
        if self.edited:
            d["edited"] = True
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Recipe:
        """A recipe as ``to_dict`` writes it (and as older plans wrote it); QuantizationError if malformed."""
        kind = d.get("kind")
        try:
            ovs = tuple(Override(str(p), str(t)) for p, t in d.get("overrides") or [])
            edited = bool(d.get("edited"))
            method = check_method(str(d.get("method", DEFAULT_METHOD)))
            if kind == "preset":
                keep = d.get("keep_first_last")
                return Recipe(
                    RecipeKind.PRESET,
                    str(d["preset"]),
                    imatrix=bool(d.get("imatrix")),
                    keep_first_last=None if keep is None else (_layers_n(keep["n"]), str(keep["type"])),
                    overrides=ovs,
                    edited=edited,
                    method=method,
                )
            if kind == "uniform":
                return Recipe(RecipeKind.UNIFORM, str(d["type"]), overrides=ovs, edited=edited, method=method)
            if kind == "budget":
                cands = tuple(str(c) for c in d.get("candidates") or ())
                return Recipe(
                    RecipeKind.BUDGET, str(d["budget"]), edited=edited, method=method, candidates=cands
                )
            if kind == "first_last":
                keep_fl = (_layers_n(d["n"]), str(d["high"]))
                return Recipe(
                    RecipeKind.UNIFORM,
                    str(d["low"]),
                    keep_first_last=keep_fl,
                    overrides=ovs,
                    edited=edited,
                    method=method,
                )
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise QuantizationError(
                f"The plan recipe {quote(kind)} is malformed ({type(err).__name__}: {quote(str(err), 100)})."
            ) from None
        raise QuantizationError(f"The plan recipe kind {quote(kind)} is unknown.")


def _layers_n(value: Any) -> int:
    return safejson.bounded_int(
        value, "the number of first/last layers", 0, MAX_FIRST_LAST, ValueError
    )  # a ValueError: the recipe's "is malformed (...)" sentence wraps it


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
    """Tensor name (HF) → qtype, with how it was made (``recipe``, None when unknown) and the fallbacks.

    ``method`` is how every quantized tensor's codes are chosen unless ``methods`` names another
    for it (``studio.core.quant.methods``).
    """

    types: Mapping[str, str]
    name: str = "custom"
    ftype: int = 1  # llama_ftype written as general.file_type
    fallbacks: tuple[Fallback, ...] = ()
    notes: tuple[str, ...] = ()
    recipe: Recipe | None = None
    method: str = DEFAULT_METHOD
    methods: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # freeze the mappings so a Plan can be shared between threads safely
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))
        for name, t in self.types.items():
            check_type(t, f"Plan gives tensor {name!r} the unknown type {t!r}.")
        object.__setattr__(self, "method", check_method(self.method))
        methods = {str(k): check_method(v) for k, v in self.methods.items()}
        for name in methods:
            if name not in self.types:
                raise QuantizationError(
                    f"The plan gives a method to tensor {name!r}, which it does not type."
                )
        object.__setattr__(self, "methods", MappingProxyType(methods))

    def method_of(self, name: str) -> str:
        """The method of tensor ``name`` (``rtn`` for tensors kept in a float type)."""
        if self.type_of(name) in FLOAT_TYPES:
            return DEFAULT_METHOD
        return self.methods.get(name, self.method)

    @property
    def calibrated(self) -> bool:
        """Whether any tensor's method needs a calibration run."""
        return any(method_info(self.method_of(n)).calibrated for n in self.types)

    def type_of(self, name: str) -> str:
        """The qtype of tensor ``name``; QuantizationError if the plan does not cover it."""
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
            "recipe": self.recipe.to_dict() if self.recipe is not None else {},
            "types": dict(self.types),
            "method": self.method,
            "methods": dict(self.methods),
            "fallbacks": [f.to_dict() for f in self.fallbacks],
            "notes": list(self.notes),
        }

    @staticmethod
    def from_json(text: str, info: ModelInfo | None = None, source: str | None = None) -> Plan:
        """A plan from JSON text; with ``info``, checked against that model's tensors.

        ``source`` (the file name) is named in the error messages.
        """
        what = f"The plan file {source}" if source else "The plan file"
        d = safejson.loads(text, what, QuantizationError)
        return Plan.from_dict(d, info, source)

    @staticmethod
    def from_dict(d: Any, info: ModelInfo | None = None, source: str | None = None) -> Plan:
        """A plan from a dict as written by ``to_dict``; ``source`` is named in error messages.

        A file with only a recipe is remade for ``info``; next to a types table (which is what the
        export follows) a recipe that cannot be read is dropped rather than refused.
        """
        what = f"The plan file {source}" if source else "The plan file"
        if not isinstance(d, dict) or "version" not in d:
            raise QuantizationError(f"{what} has no 'version' field; it is not a Quant Studio plan.")
        if d["version"] != PLAN_VERSION:
            raise QuantizationError(
                f"{what} has version {quote(d['version'])}; this Quant Studio reads version {PLAN_VERSION}."
            )
        types = d.get("types")
        recipe = d.get("recipe") or {}
        if not isinstance(types, dict) or not types:
            if info is not None and isinstance(recipe, dict) and recipe:
                return plan_from_recipe(info, Recipe.from_dict(recipe))
            raise QuantizationError(f"{what} has no 'types' table.")
        methods = d.get("methods") or {}
        if not isinstance(methods, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in methods.items()
        ):
            raise QuantizationError(f"{what}: its 'methods' table must map tensor names to method names.")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in types.items()):
            raise QuantizationError(f"{what}: its 'types' table must map tensor names to type names.")
        try:
            typed_recipe = Recipe.from_dict(recipe) if isinstance(recipe, dict) and recipe else None
        except QuantizationError:
            typed_recipe = None
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
                ftype=safejson.bounded_int(d.get("ftype", 1), "the plan's ftype", 0, MAX_FTYPE, ValueError),
                fallbacks=fallbacks,
                notes=tuple(str(n) for n in d.get("notes") or []),
                recipe=typed_recipe,
                method=str(d.get("method", DEFAULT_METHOD)),
                methods=methods,
            )
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            # a hand-edited file: its 'fallbacks', 'ftype' or 'notes' are not what to_dict writes
            raise QuantizationError(
                f"{what} is malformed ({type(err).__name__}: {quote(str(err), 100)})."
            ) from None
        if info is not None:
            check_plan(plan, info)
        return plan

    def summary(self, info: ModelInfo) -> PlanSummary:
        """Bytes, bits per weight and tensor counts of this plan's output for ``info``."""
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


def check_plan(plan: Plan, info: ModelInfo) -> None:
    """Raise QuantizationError unless ``plan`` covers exactly the tensors exported for ``info``
    with types their rows allow."""
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


def _compile(overrides: Sequence[Override]) -> list[tuple[Any, str]]:
    compiled = []
    for o in overrides:
        check_type(o.qtype, f"Override {o.pattern!r} asks for the unknown type {o.qtype!r}.")
        compiled.append((compile_pattern(o.pattern, QuantizationError), o.qtype))
    return compiled


def _finish(
    info: ModelInfo,
    wanted: Mapping[str, str],
    *,
    name: str,
    ftype: int,
    recipe: Recipe | None,
    overrides: Sequence[Override] = (),
    fallbacks: Iterable[Fallback] = (),
    method: str = DEFAULT_METHOD,
    methods: Mapping[str, str] | None = None,
) -> Plan:
    """The plan giving each tensor its ``wanted`` qtype, or that of the first override matching it.

    Tensors llama.cpp does not quantize (and empty ones) stay F32; fallbacks are applied to rows the
    asked qtype cannot split. ``fallbacks`` recorded upstream stay listed for tensors no override
    re-asked, as long as the tensor really ended up at the fallback's qtype.
    """
    compiled = _compile(overrides)
    types: dict[str, str] = {}
    records = {f.tensor: f for f in fallbacks}
    notes: list[str] = []
    for tm in layout(info).tensors:
        if not allows_quantization(tm.gguf_name, len(tm.shape)) or math.prod(tm.shape) == 0:
            if tm.shape and math.prod(tm.shape) == 0:
                notes.append(f"{tm.hf_name} is empty and is kept in F32.")
            types[tm.hf_name] = "F32"
            continue
        t = wanted.get(tm.hf_name)
        if t is None:
            raise QuantizationError(
                f"The plan {name!r} has no type for tensor {tm.hf_name!r} of {info.path}.",
                hint="The plan was probably made for another model; make a new one.",
            )
        for rx, qt in compiled:
            if rx.search(tm.hf_name) or rx.search(tm.gguf_name):
                t = qt
                records.pop(tm.hf_name, None)
                break
        got, why = fallback_type(t, tm.n_per_row)
        if why is not None and tm.hf_name not in records:
            records[tm.hf_name] = Fallback(tm.hf_name, tm.gguf_name, t, got, why)
        types[tm.hf_name] = got
    fbs = tuple(f for f in records.values() if types.get(f.tensor) == f.got)
    kept = {k: v for k, v in (methods or {}).items() if k in types}
    return Plan(
        types,
        name=name,
        ftype=ftype,
        fallbacks=fbs,
        notes=tuple(notes),
        recipe=recipe,
        method=method,
        methods=kept,
    )


def _with_suffix(name: str, suffix: str) -> str:
    return name if name.endswith(suffix) else name + suffix


# ------------------------------------------------------------------------------------ making plans


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
        recipe=Recipe(RecipeKind.PRESET, p.name, imatrix=imatrix, overrides=tuple(overrides)),
        overrides=overrides,
        fallbacks=choice.fallbacks,
    )


def plan_uniform(info: ModelInfo, qtype: str, overrides: Sequence[Override] = ()) -> Plan:
    """Every quantizable tensor at ``qtype`` (e.g. Q8_0 for INT8, Q4_K or Q4_0 for INT4)."""
    qtype = check_type(qtype.upper())
    return _finish(
        info,
        {tm.hf_name: qtype for tm in layout(info).tensors},
        name=f"uniform {qtype}",
        ftype=QTYPES[qtype].ftype or 1,
        recipe=Recipe(RecipeKind.UNIFORM, qtype, overrides=tuple(overrides)),
        overrides=overrides,
    )


def plan_first_last(info: ModelInfo, n: int, high: str, low: str, overrides: Sequence[Override] = ()) -> Plan:
    """``low`` everywhere, then ``keep_first_last`` at ``high``, then the overrides."""
    plan = keep_first_last(plan_uniform(info, low), info, n, high)
    if overrides:
        plan = with_overrides(plan, info, overrides)
    return dataclasses.replace(plan, name=f"first/last {n} at {high.upper()}, rest {low.upper()}")


def plan_from_recipe(info: ModelInfo, recipe: Recipe | Mapping[str, Any]) -> Plan:
    """Remake a plan for ``info`` from its recipe (a ``Recipe`` or the dict a plan file holds)."""
    r = recipe if isinstance(recipe, Recipe) else Recipe.from_dict(recipe)
    if r.kind is RecipeKind.BUDGET:
        raise QuantizationError(
            f"A plan for the budget {r.base} is made from a sensitivity scan of the model, not from its recipe.",
            hint=f"Run quant-studio-cli plan MODEL --budget {r.base} for this model.",
        )
    if r.keep_first_last is None:  # one step, named as when it was made
        if r.kind is RecipeKind.PRESET:
            plan = plan_from_preset(info, r.base, r.overrides, imatrix=r.imatrix)
        else:
            plan = plan_uniform(info, r.base, r.overrides)
    elif r.kind is RecipeKind.UNIFORM:
        plan = plan_first_last(info, *r.keep_first_last, r.base, r.overrides)
    else:
        plan = keep_first_last(plan_from_preset(info, r.base, imatrix=r.imatrix), info, *r.keep_first_last)
        plan = with_overrides(plan, info, r.overrides) if r.overrides else plan
    return with_method(plan, info, r.method) if r.method != DEFAULT_METHOD else plan


def plan_from_types(
    info: ModelInfo,
    types: Mapping[str, str],
    *,
    name: str,
    recipe: Recipe | None = None,
    notes: Sequence[str] = (),
    method: str = DEFAULT_METHOD,
) -> Plan:
    """The plan giving each tensor of ``types`` (HF name → qtype, every quantizable tensor named) its
    qtype, fallbacks applied; its file type is that of the qtype holding most bytes (llama.cpp names a
    mixed file after its main type)."""
    plan = _finish(info, types, name=name, ftype=1, recipe=recipe, method=method)
    by_bytes: dict[str, int] = {}
    for tm in layout(info).tensors:
        q = plan.types[tm.hf_name]
        if q not in FLOAT_TYPES:
            by_bytes[q] = by_bytes.get(q, 0) + tensor_bytes(q, tm.shape)
    main = max(by_bytes, key=lambda q: by_bytes[q]) if by_bytes else "F16"
    return dataclasses.replace(plan, ftype=QTYPES[main].ftype or 1, notes=plan.notes + tuple(notes))


# ----------------------------------------------------------------------------------------- verbs


def with_types(plan: Plan, info: ModelInfo, changes: Mapping[str, str]) -> Plan:
    """``plan`` with the tensors named in ``changes`` (HF names) asked to take new qtypes.

    A tensor llama.cpp never quantizes may only be asked for a float type; fallbacks are applied
    (and listed) where a row cannot take the asked qtype.
    """
    by_name = layout(info).by_hf()
    for name, qtype in changes.items():
        check_type(qtype, f"Tensor {name!r} is asked for the unknown type {qtype!r}.")
        tm = by_name.get(name)
        if tm is None:
            raise QuantizationError(f"The plan names tensor {name!r}, which {info.path} does not export.")
        if qtype not in FLOAT_TYPES and not allows_quantization(tm.gguf_name, len(tm.shape)):
            raise QuantizationError(f"Tensor {name!r} ({tm.gguf_name}) must stay F32, not {qtype}.")
    return _finish(
        info,
        {**plan.types, **changes},
        name=_with_suffix(plan.name, " (edited)"),
        ftype=plan.ftype,
        recipe=None if plan.recipe is None else dataclasses.replace(plan.recipe, edited=True),
        fallbacks=[f for f in plan.fallbacks if f.tensor not in changes],
        method=plan.method,
        methods=plan.methods,
    )


def first_last_tensors(info: ModelInfo, n: int) -> tuple[str, ...]:
    """HF names of the quantizable tensors ``keep_first_last`` raises: those of the first and last
    ``n`` layers, and those outside any layer (token embeddings, output)."""
    if n < 0:
        raise QuantizationError(f"The number of first/last layers must be 0 or more, not {n}.")
    lay = layout(info)
    n_layers = max([t.layer + 1 for t in lay.tensors if t.layer is not None], default=0)
    return tuple(
        tm.hf_name
        for tm in lay.tensors
        if allows_quantization(tm.gguf_name, len(tm.shape))
        and math.prod(tm.shape) > 0
        and (tm.layer is None or tm.layer < n or tm.layer >= n_layers - n)
    )


def keep_first_last(plan: Plan, info: ModelInfo, n: int, qtype: str) -> Plan:
    """``plan`` with the first and last ``n`` layers, the token embeddings and the output at ``qtype``."""
    qtype = check_type(qtype.upper())
    names = first_last_tensors(info, n)
    r = plan.recipe
    if r is not None:
        # the recipe replays first/last before overrides, once: any other order is an edit
        fits = r.keep_first_last is None and not r.overrides and not r.edited
        r = (
            dataclasses.replace(r, keep_first_last=(n, qtype))
            if fits
            else dataclasses.replace(r, edited=True)
        )
    return _finish(
        info,
        {**plan.types, **dict.fromkeys(names, qtype)},
        name=f"{plan.name}, first/last {n} at {qtype}",
        ftype=plan.ftype,
        recipe=r,
        fallbacks=[f for f in plan.fallbacks if f.tensor not in names],
        method=plan.method,
        methods=plan.methods,
    )


def tensors_matching(info: ModelInfo, pattern: str) -> tuple[str, ...]:
    """HF names of the quantizable tensors whose HF or GGUF name matches ``pattern`` (re.search),
    i.e. those an override with this pattern changes; QuantizationError for an invalid pattern."""
    rx = _compile([Override(pattern, "F32")])[0][0]
    return tuple(
        tm.hf_name
        for tm in layout(info).tensors
        if allows_quantization(tm.gguf_name, len(tm.shape))
        and math.prod(tm.shape) > 0
        and (rx.search(tm.hf_name) or rx.search(tm.gguf_name))
    )


def with_overrides(plan: Plan, info: ModelInfo, overrides: Sequence[Override]) -> Plan:
    """``plan`` with ``overrides`` applied on top (first match wins), fallbacks recomputed."""
    r = plan.recipe
    if r is not None and overrides:
        # on top of the earlier overrides: the new ones come first, so they win where both match
        r = dataclasses.replace(r, overrides=(*overrides, *r.overrides))
    return _finish(
        info,
        plan.types,
        name=_with_suffix(plan.name, " + overrides"),
        ftype=plan.ftype,
        recipe=r,
        overrides=overrides,
        fallbacks=plan.fallbacks,
        method=plan.method,
        methods=plan.methods,
    )


def with_method(plan: Plan, info: ModelInfo, method: str, tensors: Iterable[str] | None = None) -> Plan:
    """``plan`` with ``method`` as the plan-wide default (``tensors`` None) or for the named tensors.

    A named tensor must be one the plan quantizes: a float tensor has no codes to choose.
    """
    method = check_method(method)
    if tensors is None:
        r = plan.recipe
        if r is not None:
            r = dataclasses.replace(r, method=method)
        return dataclasses.replace(plan, method=method, recipe=r)
    names = list(tensors)
    for name in names:
        t = plan.type_of(name)
        if t in FLOAT_TYPES:
            raise QuantizationError(
                f"Tensor {name!r} stays {t}; a method chooses the codes of quantized tensors."
            )
    r = None if plan.recipe is None else dataclasses.replace(plan.recipe, edited=True)
    return dataclasses.replace(plan, methods={**plan.methods, **dict.fromkeys(names, method)}, recipe=r)
