"""The sequential layer runner: the one pipeline every calibrated feature runs on (see the package docstring).

Layer-wise mode builds the model from its config with every parameter on the meta device (buffers
such as rotary frequencies stay real), loads the parts outside the decoder layers (embeddings,
final norm, the head when asked for), and runs the model's own forward once per chunk with every
decoder layer's ``forward`` replaced by a recorder: the first records the hidden states that enter
layer 0, each records the arguments the model passes to its layer (attention mask, position
embeddings, ...), the last stops the forward. Then, layer by layer: that layer's weights are read
from the checkpoint onto the device (on a CPU, safetensors data in the model's dtype is used in place
through a copy-on-write map: no copy), hooks on each linear input feed the consumers while every chunk
runs through it, the consumers may replace weights (the outputs are then computed again with the new
weights), the outputs become the next layer's inputs and the weights go back to the meta device.

Whole-model mode (an architecture whose layers cannot be found or whose checkpoint names do not match
its modules) loads the model with ``from_pretrained`` when it fits in memory and runs each chunk
through it with the same hooks; consumers that must change weights between layers refuse it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from studio.core import hardware
from studio.core.calib.data import Chunks
from studio.core.calib.hidden_spool import HiddenSpool, spool_states
from studio.core.chat import hf_backend
from studio.core.chat.hf_backend import resolve_dtype
from studio.core.errors import CalibrationError
from studio.core.jobs import SPAN_STEPS, JobContext, null_context
from studio.core.model.hf_progress import no_hf_progress_bars
from studio.core.plan.job_estimate import check_fits, estimate_calibrated
from studio.core.plan.scan import stored_narrow_head
from studio.core.progress import WorkMeter

# config.json model types that are encoders: built with AutoModel, never with a causal LM head.
_ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "electra", "deberta", "deberta-v2"})
_FIT_SHARE = 0.7  # the whole-model fallback needs its weights within this share of free memory
FORWARD = "forward"  # the kind of work of the passes through the model (``RunMeter``)


class RunnerMode(str, Enum):
    """How the model was run."""

    LAYERWISE = "layer-wise"
    WHOLE_MODEL = "whole model"


@dataclass(frozen=True)
class LinearSite:
    """One matrix product whose input the runner observes.

    ``name`` is the checkpoint's weight name (``model.layers.3.self_attn.q_proj.weight``; for fused
    experts the 3-D parameter, ``model.layers.3.mlp.experts.down_proj``). ``layer`` is None for the
    output head.
    """

    name: str
    module: str
    layer: int | None
    in_features: int
    out_features: int
    n_experts: int = 1
    # "linear", "conv1d" (GPT-2, weight stored (in, out)), "experts" or "router" (an MoE router module
    # that multiplies by its own (experts, hidden) weight; observed like "linear")
    kind: str = "linear"


@dataclass(frozen=True)
class RunSpec:
    """What a run covers; every consumer gets it before the first layer."""

    model: str
    mode: RunnerMode
    device: str
    dtype: str
    n_layers: int
    hidden: int
    n_chunks: int
    n_ctx: int
    sites: tuple[LinearSite, ...]
    head: bool  # logits are computed (consumers' ``logits`` is called)
    outer: OuterView | None = field(default=None, compare=False, repr=False)  # layer-wise runs only
    meter: RunMeter | None = field(default=None, compare=False, repr=False)  # the run's progress

    def sites_of(self, layer: int | None) -> tuple[LinearSite, ...]:
        """The sites inside decoder layer ``layer`` (None: the head)."""
        return tuple(s for s in self.sites if s.layer == layer)


@dataclass(frozen=True)
class RunInfo:
    """How a run went."""

    mode: RunnerMode
    device: str
    dtype: str
    n_layers: int
    n_chunks: int
    n_tokens: int
    seconds: float
    recomputed_layers: tuple[int, ...]  # layers whose outputs were computed again after a weight change
    peak_layer_bytes: int  # largest layer's weights as materialised


class LayerView:
    """Decoder layer ``index`` while its weights are on the device.

    ``weight(site)`` is the parameter as the module holds it (nn.Linear: (out, in); GPT-2 Conv1D:
    (in, out); experts: (E, out, in)); ``set_weight`` replaces its values, after which the runner
    computes the layer's outputs again so the next layer sees the changed layer. ``param`` and
    ``set_param`` do the same for any parameter of the layer by its path inside the layer
    (``input_layernorm.weight``: AWQ folds its scales there); ``checkpoint_name`` names it as the
    checkpoint does.
    """

    def __init__(
        self,
        index: int,
        module: Any,
        sites: tuple[LinearSite, ...],
        root: Any,
        prefix: str = "",
        names: dict[str, str] | None = None,
        *,
        args: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
        inputs: Sequence[Any] = (),
    ) -> None:
        self.index = index
        self.module = module
        self.sites = sites
        self.prefix = prefix  # module path of the layer plus "." (``model.layers.3.``)
        self._root = root
        self._names = names or {}
        self._args = args
        # the hidden states (1 × tokens × hidden) that entered, per chunk (a spool stays on disk)
        self.inputs = inputs if isinstance(inputs, HiddenSpool) else tuple(inputs)
        self.changed = False

    def forward(self, hidden: Any) -> Any:
        """The layer's output for ``hidden`` (batch × tokens × hidden, the run's tokens per chunk), with
        the arguments the model passes to this layer (mask, positions): extra streams, such as the
        sensitivity scan's perturbed copies, go through the layer as the chunks did."""
        if self._args is None:
            raise CalibrationError("This layer view cannot run the layer again (whole-model mode).")
        rest, kwargs = self._args
        out = self.module(hidden, *rest, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    @contextlib.contextmanager
    def swapped(self, site: LinearSite, value: Any) -> Iterator[None]:
        """While active, ``site`` computes with ``value`` (same shape); the layer counts as unchanged."""
        with swapped_param(self._param(site), value):
            yield

    def param(self, name: str) -> Any:
        """The parameter at ``name`` inside the layer (do not modify it in place; use ``set_param``)."""
        return self.module.get_parameter(name)

    def set_param(self, name: str, value: Any) -> None:
        """Replace the values of the layer's parameter ``name`` (same shape)."""
        self._assign(self.param(name), value, f"value for {self.prefix}{name}")

    def checkpoint_name(self, name: str) -> str:
        """The checkpoint's tensor name of the layer's parameter ``name``."""
        path = self.prefix + name
        return self._names.get(path, path)

    def _param(self, site: LinearSite) -> Any:
        if site.kind == "experts":
            return self._root.get_parameter(site.name)
        return self._root.get_submodule(site.module).weight

    def submodule(self, site: LinearSite) -> Any:
        """The module of ``site`` (an ``nn.Linear``, a GPT-2 ``Conv1D`` or the experts' module)."""
        return self._root.get_submodule(site.module)

    def weight(self, site: LinearSite) -> Any:
        """The weight tensor of ``site`` (do not modify it in place; use ``set_weight``)."""
        return self._param(site)

    def set_weight(self, site: LinearSite, value: Any) -> None:
        """Replace the weight of ``site`` (same shape) before the layer's outputs are computed."""
        self._assign(self._param(site), value, f"weight for {site.name}")

    def _assign(self, p: Any, value: Any, what: str) -> None:
        import torch

        v = torch.as_tensor(value)
        if tuple(v.shape) != tuple(p.shape):
            raise CalibrationError(
                f"A new {what} has shape {tuple(v.shape)}, the layer needs {tuple(p.shape)}."
            )
        with torch.no_grad():
            p.copy_(v.to(device=p.device, dtype=p.dtype))
        self.changed = True


@contextlib.contextmanager
def swapped_param(p: Any, value: Any) -> Iterator[None]:
    """While active, parameter ``p`` (and every module sharing it) holds ``value``; restored after."""
    import torch

    v = torch.as_tensor(value)
    if tuple(v.shape) != tuple(p.shape):
        raise CalibrationError(
            f"A replacement of shape {tuple(v.shape)} does not fit a parameter of {tuple(p.shape)}."
        )
    orig = p.data
    p.data = v.to(device=orig.device, dtype=orig.dtype)
    try:
        yield
    finally:
        p.data = orig


def _exact_in(w: Any, narrow: Any) -> bool:
    """Whether every value of ``w`` is exactly one of the type ``narrow`` (checked a block of rows at a time)."""
    import torch

    rows = w.detach().reshape(-1, w.shape[-1])
    per = max(1, (1 << 24) // max(1, rows.shape[1]))
    return all(
        torch.equal(rows[a : a + per].to(narrow).to(rows.dtype), rows[a : a + per])
        for a in range(0, rows.shape[0], per)
    )


@contextlib.contextmanager
def _without_embedding(sk: _Skeleton, device: str) -> Iterator[None]:
    """The model's forward with its input embedding skipped while that is not loaded (an untied model's
    head pass: layer 0's stand-in replaces its output anyway)."""
    import torch

    emb = sk.model.get_input_embeddings()
    if emb is None or getattr(emb, "weight", None) is None or emb.weight.device.type != "meta":
        yield
        return
    width, dt = int(emb.weight.shape[-1]), emb.weight.dtype
    emb.forward = lambda ids, *_a, **_k: torch.zeros((*ids.shape, width), dtype=dt, device=device)
    try:
        yield
    finally:
        emb.__dict__.pop("forward", None)


class OuterView:
    """The model outside its decoder layers during a layer-wise run: the embeddings and, when the run
    has a head, the final norm and output head. Consumers reach it as ``spec.outer``.

    ``embedding`` and ``head`` name the checkpoint tensors (``head`` is None when the head is tied to
    the embeddings, or not loaded); ``embed`` and ``logits`` run the model's own code, so scaling,
    position embeddings, final norm and soft-capping are those of the architecture.
    """

    def __init__(self, sk: _Skeleton, device: str, has_head: bool, mat: _Materializer | None = None) -> None:
        self._sk = sk
        self._device = device
        self._has_head = has_head
        self._mat = mat
        # no consumer of the run changes weights, so the head's values are the checkpoint's (``stored``)
        self.frozen = False
        emb = sk.model.get_input_embeddings()
        path = next((n for n, m in sk.model.named_modules() if m is emb), None)
        self.embedding: str | None = sk.names.get(f"{path}.weight") if path else None
        self._emb_path = f"{path}.weight" if path else None
        head_w = f"{sk.head_path}.weight" if sk.head_path else None
        self.tied = bool(sk.tied_head)
        self.head: str | None = sk.names.get(head_w) if (head_w and has_head and not self.tied) else None
        self._head_w = head_w

    def param(self, name: str) -> Any:
        """The parameter of checkpoint tensor ``name`` (the embedding or head weight); KeyError if none."""
        for path, ck in self._sk.names.items():
            if ck == name:
                return self._sk.model.get_parameter(path)
        raise KeyError(name)

    @contextlib.contextmanager
    def stored(self, name: str) -> Iterator[Any]:
        """While active, the untied output head ``name`` is held as the checkpoint stores it where that is
        narrower than the run's dtype (bfloat16 under float32: 1 GB instead of 2.1 GB at Llama 3's
        vocabulary) and the run's copy is let go: yields that tensor on the run's device, or None where
        nothing is narrower, a consumer of the run changes weights, or a value of the run's copy is not
        exactly a stored one (then nothing changes). The caller holds no reference to the run's copy; it
        is read again on a normal exit."""
        import torch

        mat, path = self._mat, self._head_w
        if mat is None or not self.frozen or self.head is None or name != self.head or path is None:
            yield None
            return
        narrow = {"BF16": torch.bfloat16, "F16": torch.float16}.get(str(mat.ckpt.info.tensor(name).dtype))
        p = self._sk.model.get_parameter(path)
        if narrow is None or p.device.type == "meta" or p.element_size() <= narrow.itemsize:
            yield None
            return
        # the run's copy and the stored one are never whole at once (they were 3.15 GB beside the original's
        # distribution): the run's values are checked, let go, and the stored tensor read
        exact = _exact_in(p, narrow)
        del p
        if not exact:
            yield None
            return
        mat.unload([path])
        t = _read_tensor(mat.ckpt, name).to(device=self._device)
        yield t
        # not on an error: the run ends there, and the caller's frames still hold what it measured with
        del t
        mat.load([path])

    def embed(self, ids: Any, replace: dict[str, Any] | None = None) -> Any:
        """The hidden states entering layer 0 for token ``ids`` (batch × tokens), with the checkpoint
        tensors in ``replace`` (name → values) used instead of the loaded ones."""
        import torch

        sk = self._sk
        got: list[Any] = []

        def first(*args: Any, **kwargs: Any) -> Any:
            got.append(args[0] if args else kwargs["hidden_states"])
            raise _Stop

        stack = contextlib.ExitStack()
        with stack:
            for name, value in (replace or {}).items():
                stack.enter_context(swapped_param(self.param(name), value))
            sk.layers[0].forward = first
            try:
                sk.base(input_ids=torch.as_tensor(ids, device=self._device), use_cache=False)
            except _Stop:
                pass
            finally:
                sk.layers[0].__dict__.pop("forward", None)
        if not got:
            raise SkeletonError("the model's forward did not reach the first decoder layer")
        return got[0].detach()

    def head_input(self, hidden: Any) -> Any:
        """What the output head multiplies for the last hidden states ``hidden`` (batch × tokens ×
        hidden): the model's own final norm applied, the head itself not run."""
        import torch

        if not self._has_head or self._sk.head_path is None:
            raise CalibrationError("This run has no output head.")
        sk = self._sk
        head_mod = sk.model.get_submodule(sk.head_path)
        got: list[Any] = []

        def pre(_m: Any, args: tuple[Any, ...]) -> None:
            got.append(args[0])
            raise _Stop

        def first(*_a: Any, **_k: Any) -> Any:
            return hidden

        def identity(*args: Any, **kwargs: Any) -> Any:
            return args[0] if args else kwargs["hidden_states"]

        handle = head_mod.register_forward_pre_hook(pre)
        for i, layer in enumerate(sk.layers):
            layer.forward = first if i == 0 else identity
        try:
            ids = torch.zeros(hidden.shape[:2], dtype=torch.long, device=self._device)
            with _without_embedding(sk, self._device):
                sk.model(input_ids=ids, use_cache=False)
        except _Stop:
            pass
        finally:
            handle.remove()
            for layer in sk.layers:
                layer.__dict__.pop("forward", None)
        if not got:
            raise SkeletonError("the model's forward did not reach its output head")
        return got[0].detach()

    def logits(self, hidden: Any, rows: Any = None, weight: Any = None) -> Any:
        """Logits (batch × tokens × vocabulary, float32) of the last hidden states ``hidden`` through the
        model's final norm, head and soft-capping; ``rows`` (token ids) keeps only those outputs,
        ``weight`` (rows × hidden) replaces the head's weight for them (a quantized head)."""
        import torch

        if not self._has_head or self._head_w is None:
            raise CalibrationError("This run has no output head to compute logits with.")
        sk = self._sk
        head_mod = sk.model.get_submodule(self._sk.head_path)
        full = head_mod.weight
        if full.device.type == "meta":
            raise SkeletonError("the output head's weight was not loaded")
        w = full if rows is None else full[torch.as_tensor(rows, device=full.device)]
        if weight is not None:
            w = torch.as_tensor(weight).to(device=full.device, dtype=full.dtype)
        bias = getattr(head_mod, "bias", None)
        if bias is not None and rows is not None:
            bias = bias[torch.as_tensor(rows, device=bias.device)]

        def first(*_a: Any, **_k: Any) -> Any:
            return hidden

        def identity(*args: Any, **kwargs: Any) -> Any:
            return args[0] if args else kwargs["hidden_states"]

        saved = (head_mod._parameters.get("weight"), head_mod._parameters.get("bias"))
        head_mod._parameters["weight"] = torch.nn.Parameter(w, requires_grad=False)
        if bias is not None:
            head_mod._parameters["bias"] = torch.nn.Parameter(bias, requires_grad=False)
        for i, layer in enumerate(sk.layers):
            layer.forward = first if i == 0 else identity
        try:
            ids = torch.zeros(hidden.shape[:2], dtype=torch.long, device=self._device)
            with _without_embedding(sk, self._device):
                out = sk.model(input_ids=ids, use_cache=False)
            return out.logits.float()
        finally:
            head_mod._parameters["weight"], b = saved
            if bias is not None:
                head_mod._parameters["bias"] = b
            for layer in sk.layers:
                layer.__dict__.pop("forward", None)


class Consumer:
    """Something the runner feeds; override what you need (every method is a no-op here).

    Call order: ``start(spec)``; per layer: ``observe`` for every linear input of every chunk,
    ``layer_collected(view)`` (weights may be replaced here), ``layer_output`` for every chunk;
    then ``logits`` per chunk when the run has a head; ``finish()``.
    """

    needs_layerwise: bool = False  # True: refuses the whole-model fallback (it cannot change weights)
    changes_weights: bool = False  # True: the runner expects to compute each layer's outputs twice
    uses_outer: bool = False  # True: uses ``spec.outer`` at any time (the runner then keeps it loaded)

    def work(self, site: LinearSite, spec: RunSpec) -> float:
        """The cost (multiply-adds, roughly) of what ``layer_collected`` or ``finish`` does with ``site``;
        the progress and ETA weigh it against the forward passes (0: nothing beyond observing)."""
        return 0.0

    def work_parts(self, site: LinearSite, spec: RunSpec) -> Mapping[str, float]:
        """``work`` by kind of work, each of which the ETA runs at its own measured rate (one kind, the
        consumer's class, unless a consumer does work of several speeds: AWQ's grid and GPTQ's sweep)."""
        return {type(self).__name__: self.work(site, spec)}

    wants_head: bool = False  # True: the run computes logits (and observes the head's input)

    def start(self, spec: RunSpec) -> None:
        """The run begins."""

    def observe(self, site: LinearSite, x: Any, chunk: int, expert: int = 0) -> None:
        """Rows ``x`` (tokens × in_features, on the device, model dtype) enter ``site``; do not keep ``x``."""

    def layer_collected(self, view: LayerView) -> None:
        """Every chunk went through layer ``view.index``; replace weights here to change what follows."""

    def layer_output(self, layer: int, chunk: int, hidden: Any) -> None:
        """The hidden states (1 × tokens × hidden) that layer ``layer`` passes on, for ``chunk``."""

    def logits(self, chunk: int, logits: Any) -> None:
        """The model's logits (tokens × vocab, float32) for ``chunk``."""

    def finish(self) -> None:
        """The run is over."""


# ------------------------------------------------------------------------------------------ helpers


class _Stop(Exception):
    """Raised by the last layer's recorder: the rest of the model's forward is not needed."""


class SkeletonError(Exception):
    """The layer-wise runner cannot handle this model (the whole-model fallback may)."""


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """While active, every parameter a module registers lands on the meta device; buffers stay real."""
    import torch
    from torch import nn

    orig = nn.Module.register_parameter

    def register(self: Any, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=False)
        orig(self, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        with torch.device("cpu"):
            yield
    finally:
        nn.Module.register_parameter = orig  # type: ignore[method-assign]


class RunMeter:
    """A run's progress, weighted by cost (``studio.core.progress``): every chunk through a layer and
    every consumer's work on a site (``Consumer.work``) is a unit with its own cost, so the bar and the
    ETA move matrix by matrix. Consumers reach it as ``spec.meter``: ``note`` says what is running,
    ``site_done`` marks their work on a site as done."""

    def __init__(self, ctx: JobContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.meter = WorkMeter(0.0, clock)
        self._work: dict[tuple[int, str], dict[str, float]] = {}  # (consumer, site) → kind → cost left

    def plan(self, consumers: Sequence[Consumer], spec: RunSpec, forward: float) -> None:
        """The run's total: ``forward`` (its passes through the model) plus each consumer's work, by kind
        (``Consumer.work_parts``): the ETA goes at each kind's own measured rate."""
        self.meter.plan(forward, FORWARD)
        for c in consumers:
            for s in spec.sites:
                parts = {k: float(w) for k, w in c.work_parts(s, spec).items() if w > 0}
                if parts:
                    self._work[(id(c), s.name)] = parts
                    for k, w in parts.items():
                        self.meter.plan(w, k)

    def step(self, cost: float, msg: str, kind: str = FORWARD) -> None:
        """``cost`` more of ``kind`` is done; report with ``msg``."""
        self.meter.add(cost, kind)
        self.note(msg)

    def note(self, msg: str) -> None:
        """Report the progress so far with ``msg`` (what is running now)."""
        self.ctx.report(int(SPAN_STEPS * self.meter.fraction), SPAN_STEPS, self.meter.line(msg))

    def site_done(self, consumer: Consumer, site: LinearSite, msg: str) -> None:
        """``consumer``'s work on ``site`` is done."""
        parts = self._work.pop((id(consumer), site.name), {})
        for k, w in parts.items():
            self.meter.add(w, k)
        self.note(msg)

    def site_some(self, consumer: Consumer, site: LinearSite, cost: float, msg: str, kind: str) -> None:
        """``cost`` of ``consumer``'s ``kind`` of work on ``site`` is done (never more than is left): a search
        that runs ahead of the rounding (AWQ's grid) moves the bar as it goes, not when the site is rounded."""
        parts = self._work.get((id(consumer), site.name), {})
        w = parts.get(kind, 0.0)
        part = min(w, max(0.0, cost))
        if kind in parts:
            parts[kind] = w - part
        self.step(part, msg, kind)

    def site_part(self, consumer: Consumer, site: LinearSite, left: int, msg: str) -> None:
        """One more part of ``consumer``'s work on ``site`` is done, ``left`` parts (this one included) having
        been to do: a tall matrix rounded in slabs moves the bar slab by slab, not once at its end."""
        parts = self._work.get((id(consumer), site.name), {})
        for k, w in parts.items():
            part = w / max(1, left)
            parts[k] = w - part
            self.meter.add(part, k)
        self.note(msg)

    def settle(self, sites: Sequence[LinearSite]) -> None:
        """Count the work on ``sites`` that consumers did not mark as done themselves."""
        names = {s.name for s in sites}
        for key in [k for k in self._work if k[1] in names]:
            for k, w in self._work.pop(key).items():
                self.meter.add(w, k)


def _forward_cost(sites: Sequence[LinearSite], n_ctx: int, hidden: int) -> float:
    """Multiply-adds of one chunk through ``sites`` (plus attention's n_ctx² × hidden)."""
    return (
        float(n_ctx) * sum(s.in_features * s.out_features * s.n_experts for s in sites)
        + float(n_ctx) ** 2 * hidden
    )


def _find_layers(model: Any, n_layers: int) -> tuple[str, Any]:
    """The ModuleList of the decoder layers: the largest list of ``n_layers`` modules."""
    from torch import nn

    best: tuple[int, str, Any] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n_layers and n_layers > 0:
            size = sum(p.numel() for p in mod.parameters())
            if best is None or size > best[0]:
                best = (size, name, mod)
    if best is None:
        raise SkeletonError(f"no list of {n_layers} decoder layers found")
    return best[1], best[2]


def _linear_kind(mod: Any) -> str | None:
    from torch import nn

    if isinstance(mod, nn.Linear):
        return "linear"
    if type(mod).__name__ == "Conv1D" and getattr(mod, "weight", None) is not None and mod.weight.ndim == 2:
        return "conv1d"  # transformers' GPT-2 Conv1D: y = x @ W + b with W stored (in, out)
    return None


def _sites_in(root: Any, prefix: str, module: Any, layer: int | None) -> list[LinearSite]:
    out = []
    for sub, mod in module.named_modules():
        path = f"{prefix}.{sub}" if sub else prefix
        kind = _linear_kind(mod)
        if kind == "linear":
            out.append(LinearSite(f"{path}.weight", path, layer, mod.in_features, mod.out_features))
        elif kind == "conv1d":
            rows, cols = mod.weight.shape
            out.append(LinearSite(f"{path}.weight", path, layer, int(rows), int(cols), kind="conv1d"))
        else:
            for pname, p in mod.named_parameters(recurse=False):
                if p.ndim == 3:  # fused experts (E, out, in), multiplied with F.linear per expert
                    out.append(
                        LinearSite(
                            f"{path}.{pname}",
                            path,
                            layer,
                            int(p.shape[2]),
                            int(p.shape[1]),
                            int(p.shape[0]),
                            "experts",
                        )
                    )
            w = getattr(mod, "weight", None)
            if type(mod).__name__.endswith("Router") and w is not None and w.ndim == 2:
                # transformers' MoE routers (MixtralTopKRouter...) hold their (experts, hidden)
                # matrix and call F.linear themselves; llama-imatrix records ffn_gate_inp too
                out.append(
                    LinearSite(f"{path}.weight", path, layer, int(w.shape[1]), int(w.shape[0]), kind="router")
                )
    del root
    return out


def _input_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args:
        return args[0]
    for k in ("input", "x", "hidden_states"):
        if k in kwargs:
            return kwargs[k]
    return next(iter(kwargs.values()))


class _Hooks:
    """Forward pre-hooks on linear sites (and a torch-function mode inside expert modules)."""

    def __init__(self, root: Any, consumers: Sequence[Consumer], chunk_ref: list[int]) -> None:
        self.root = root
        self.consumers = consumers
        self.chunk = chunk_ref
        self.handles: list[Any] = []
        self._last: tuple[Any, int, Any] | None = None

    def add(self, sites: Sequence[LinearSite]) -> None:
        experts: dict[str, list[LinearSite]] = {}
        for s in sites:
            if s.kind == "experts":
                experts.setdefault(s.module, []).append(s)
                continue
            mod = self.root.get_submodule(s.module)
            self.handles.append(mod.register_forward_pre_hook(self._linear_hook(s), with_kwargs=True))
        for path, ss in experts.items():
            self._add_experts(self.root.get_submodule(path), ss)

    def _linear_hook(self, site: LinearSite) -> Callable[..., None]:
        consumers, chunk = self.consumers, self.chunk

        def hook(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = _input_of(args, kwargs)
            last = self._last
            # q, k and v get one tensor: hand the consumers the same 2-D object so they can reduce it once
            if last is not None and last[0] is x and last[1] == x._version:
                x2 = last[2]
            else:
                x2 = x.reshape(-1, x.shape[-1])
                self._last = (x, x._version, x2)
            for c in consumers:
                c.observe(site, x2, chunk[0])

        return hook

    def _add_experts(self, mod: Any, sites: list[LinearSite]) -> None:
        import torch
        from torch.overrides import TorchFunctionMode

        params = [(s, self.root.get_parameter(s.name)) for s in sites]
        consumers, chunk = self.consumers, self.chunk
        linear = torch.nn.functional.linear

        class Capture(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                kwargs = kwargs or {}
                if func is linear:
                    w = args[1] if len(args) > 1 else kwargs.get("weight")
                    x = args[0] if args else kwargs.get("input")
                    ptr = w.untyped_storage().data_ptr()
                    for s, p in params:
                        if p.untyped_storage().data_ptr() == ptr and w.numel():
                            e = (w.storage_offset() - p.storage_offset()) // w.numel()
                            x2 = x.reshape(-1, x.shape[-1])
                            for c in consumers:
                                c.observe(s, x2, chunk[0], int(e))
                            break
                return func(*args, **kwargs)

        state: dict[str, Any] = {}

        def pre(_m: Any, _a: Any) -> None:
            state["mode"] = Capture()
            state["mode"].__enter__()

        def post(_m: Any, _a: Any, _o: Any) -> None:
            m = state.pop("mode", None)
            if m is not None:
                m.__exit__(None, None, None)

        self.handles.append(mod.register_forward_pre_hook(pre))
        self.handles.append(mod.register_forward_hook(post, always_call=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self._last = None


def _check_finite(t: Any, what: str) -> None:
    import torch

    # one reduction, no mask: NaN and Inf reach the sum (a float32 sum of hidden states never overflows)
    if not bool(torch.isfinite(torch.sum(t, dtype=torch.float32))):
        raise CalibrationError(
            f"{what} contains NaN or Inf values; the weights or the chosen precision overflow there.",
            hint="Try --dtype float32, or check the checkpoint for NaN/Inf weights.",
        )


def _oom_error(device: str, where: str) -> CalibrationError:
    return CalibrationError(
        f"Calibration ran out of memory on {device} at {where}.",
        hint="Use fewer chunks, a smaller --ctx, or --device cpu.",
    )


# ------------------------------------------------------------------------------------------ skeleton


@dataclass
class _Skeleton:
    model: Any
    base: Any
    layers_path: str
    layers: Any
    names: dict[str, str]  # parameter path -> checkpoint tensor name
    shared: dict[str, list[str]]  # parameter path -> other paths sharing the same Parameter
    head_path: str | None
    tied_head: bool
    notes: list[str] = field(default_factory=list)


def _model_classes(model_type: str) -> list[Any]:
    from transformers import AutoModel, AutoModelForCausalLM

    return [AutoModel] if model_type in _ENCODERS else [AutoModelForCausalLM, AutoModel]


def _build_skeleton(info: Any, config: Any, n_layers: int) -> _Skeleton:
    from transformers.initialization import no_init_weights

    model = None
    last: Exception | None = None
    for cls in _model_classes(str(info.model_type)):
        try:
            with params_on_meta(), no_init_weights():
                model = cls.from_config(config, trust_remote_code=False)
            break
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            last = err
    if model is None:
        raise SkeletonError(f"transformers cannot build {info.model_type!r}: {last}")
    model.eval()
    layers_path, layers = _find_layers(model, n_layers)
    ckpt_names = {t.name for t in info.tensors}
    prefix = getattr(model, "base_model_prefix", "") or ""
    by_id: dict[int, list[str]] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(pname)
    names: dict[str, str] = {}
    shared: dict[str, list[str]] = {}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_path = None
    if head is not None:
        head_path = next((n for n, m in model.named_modules() if m is head), None)
    tied_head = False
    for group in by_id.values():
        found = None
        for pname in group:
            for cand in (
                pname,
                f"{prefix}.{pname}",
                pname[len(prefix) + 1 :] if pname.startswith(prefix + ".") else None,
            ):
                if cand and cand in ckpt_names:
                    found = cand
                    break
            if found:
                break
        first = group[0]
        shared[first] = group[1:]
        if found is None:
            if head_path and all(p.startswith(head_path + ".") for p in group):
                tied_head = True  # the head is tied to the embeddings (loaded with them, if asked for)
                continue
            raise SkeletonError(f"the checkpoint has no tensor for {first}")
        names[first] = found
        if head_path and any(p == f"{head_path}.weight" for p in group[1:]):
            tied_head = True
    base = getattr(model, "base_model", model)
    return _Skeleton(model, base, layers_path, layers, names, shared, head_path, tied_head)


def _set_param(root: Any, path: str, value: Any) -> None:
    from torch import nn

    mod_path, _, pname = path.rpartition(".")
    mod = root.get_submodule(mod_path) if mod_path else root
    mod._parameters[pname] = (
        value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False)
    )


_COPYABLE = {"F32": None, "F16": None, "BF16": "bfloat16"}


def _read_tensor(ckpt: Any, name: str) -> Any:
    """One tensor as a CPU torch tensor over a private copy of just its bytes (``map_raw``).

    The copy is freed when the layer's weights go back to the meta device (safetensors' own handle
    keeps the whole file mapped, so every layer read would stay in the process's resident memory until
    the end); it is read, not mapped, so a checkpoint truncated during the run is one sentence instead
    of SIGBUS; a consumer may replace weights in place without touching the file.
    """
    import torch

    info = ckpt.info.tensor(name)
    if info.dtype in _COPYABLE and getattr(ckpt.info.format, "value", "") == "safetensors":
        t = torch.from_numpy(ckpt.map_raw(name).reshape(info.shape))
        return t.view(torch.bfloat16) if info.dtype == "BF16" else t
    return ckpt.read_torch(name)


class _Materializer:
    """Reads parameters from the checkpoint onto the device, and sends them back to the meta device."""

    def __init__(self, sk: _Skeleton, ckpt: Any, device: str, dtype: Any) -> None:
        self.sk = sk
        self.ckpt = ckpt
        self.device = device
        self.dtype = dtype

    def load(self, paths: Sequence[str]) -> int:
        import torch
        from torch import nn

        nbytes = 0
        for path in paths:
            t = _read_tensor(self.ckpt, self.sk.names[path])
            want = tuple(self.sk.model.get_parameter(path).shape)
            if tuple(t.shape) != want:
                raise SkeletonError(f"{self.sk.names[path]} has shape {tuple(t.shape)}, the model {want}")
            t = t.to(device=self.device, dtype=self.dtype if t.is_floating_point() else t.dtype)
            if torch.is_floating_point(t):
                nbytes += t.numel() * t.element_size()
            p = nn.Parameter(t, requires_grad=False)
            for q in (path, *self.sk.shared.get(path, ())):
                _set_param(self.sk.model, q, p)
        return nbytes

    def unload(self, paths: Sequence[str]) -> None:
        import torch
        from torch import nn

        for path in paths:
            p = self.sk.model.get_parameter(path)
            meta = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
            for q in (path, *self.sk.shared.get(path, ())):
                _set_param(self.sk.model, q, meta)

    def buffers_to_device(self, module: Any) -> None:
        for mod in module.modules():
            for k, b in list(mod._buffers.items()):
                if b is not None and b.device.type != "meta":
                    mod._buffers[k] = b.to(self.device)


# ------------------------------------------------------------------------------------------ runs


def _resolve(device: str, dtype: str) -> tuple[str, Any]:
    dev = hf_backend.resolve_device(device)
    return dev, resolve_dtype(dtype, dev)


def run_model(
    checkpoint: Any,
    chunks: Chunks,
    consumers: Sequence[Consumer],
    *,
    device: str = "auto",
    dtype: str = "auto",
    ctx: JobContext | None = None,
    mode: str = "auto",
) -> RunInfo:
    """Run ``chunks`` through the model of ``checkpoint`` (an opened ``Checkpoint``), feeding ``consumers``.

    ``mode``: "auto" (layer-wise, else the whole model when it fits), "layerwise" or "whole".
    """
    import torch
    from transformers import AutoConfig

    ctx = ctx or null_context()
    info = checkpoint.info
    dev, dt = _resolve(device, dtype)
    config = AutoConfig.from_pretrained(str(info.path), trust_remote_code=False)
    # MoE experts must run their per-expert loop, where each expert is one F.linear the expert hooks
    # see; transformers' default grouped_mm multiplies all experts at once and the hooks saw none
    config._experts_implementation = "eager"
    if info.config.get("tie_word_embeddings") is False:  # a rotated view unties the head (model.rotate)
        config.tie_word_embeddings = False
    n_layers = int(getattr(config, "num_hidden_layers", 0) or info.n_layers or 0)
    head = any(c.wants_head for c in consumers)
    t0 = time.monotonic()
    sk = None
    why = ""
    if mode in ("auto", "layerwise"):
        try:
            sk = _build_skeleton(info, config, n_layers)
        except SkeletonError as err:
            why = str(err)
            if mode == "layerwise":
                raise CalibrationError(f"{info.path.name} cannot be run layer by layer: {why}.") from None
    if sk is not None:
        _check_memory(info.config, chunks, consumers, dev, head, _narrow_head(sk, info))
    with torch.no_grad():
        if sk is not None:
            try:
                return _run_layerwise(sk, checkpoint, chunks, consumers, dev, dt, head, ctx, t0)
            except SkeletonError as err:
                if mode == "layerwise":
                    raise CalibrationError(f"{info.path.name} cannot be run layer by layer: {err}.") from None
                why = str(err)
        return _run_whole(info, chunks, consumers, dev, dt, head, ctx, t0, why)


def _narrow_head(sk: _Skeleton, info: Any) -> bool:
    """Whether the checkpoint stores an untied output head in bfloat16 or float16 (``OuterView.stored``)."""
    return bool(sk.head_path) and not sk.tied_head and stored_narrow_head(info)


def _check_memory(
    config: dict[str, Any],
    chunks: Chunks,
    consumers: Sequence[Consumer],
    dev: str,
    head: bool,
    narrow_head: bool = False,
) -> None:
    # every layer-wise run (calibrate, the scans, the exports' calibration) is refused in one sentence
    # before it starts when its estimated peak is above the free RAM, not killed halfway through
    hessian = any(c.changes_weights or getattr(c, "hessian_for", None) is not None for c in consumers)
    outer = any(c.uses_outer for c in consumers)
    narrow = narrow_head and not any(c.changes_weights for c in consumers)

    def estimate(n_ctx: int, n_chunks: int) -> Any:
        return estimate_calibrated(
            config, n_ctx, n_chunks, hessian=hessian, head=head, device=dev, outer=outer, narrow_head=narrow
        )

    est = estimate(chunks.n_ctx, chunks.n_chunks)
    check_fits(est, hardware.ram()[1], chunks.n_ctx, chunks.n_chunks, lambda c, k: estimate(c, k).peak_bytes)


def _capture_inputs(
    sk: _Skeleton, chunks: Chunks, dev: str, prog: RunMeter, ctx: JobContext, cost: float, spool: bool = False
) -> tuple[Any, list[tuple[tuple[Any, ...], dict[str, Any]]]]:
    import torch

    n = len(sk.layers)
    states: Any = HiddenSpool() if spool else []
    layer_args: list[tuple[tuple[Any, ...], dict[str, Any]] | None] = [None] * n

    def recorder(i: int) -> Callable[..., Any]:
        def fwd(*args: Any, **kwargs: Any) -> Any:
            if args:
                hidden, rest = args[0], args[1:]
            else:
                hidden, rest = kwargs.pop("hidden_states"), ()
            if layer_args[i] is None:
                # every chunk has n_ctx tokens from position 0, so masks and positions are the same
                layer_args[i] = (rest, dict(kwargs))
            if i == 0:
                states.append(hidden.detach())
            if i == n - 1:
                raise _Stop
            return hidden

        return fwd

    for i, layer in enumerate(sk.layers):
        layer.forward = recorder(i)
    try:
        for c in range(chunks.n_chunks):
            ctx.check_cancelled()
            ids = torch.as_tensor(chunks.tokens[c : c + 1], device=dev)
            try:
                sk.base(input_ids=ids, use_cache=False)
            except _Stop:
                pass
            prog.step(cost, f"embeddings: chunk {c + 1}/{chunks.n_chunks}")
    finally:
        for layer in sk.layers:
            layer.__dict__.pop("forward", None)
    if len(states) != chunks.n_chunks or any(a is None for a in layer_args):
        raise SkeletonError("the model's forward did not pass through every decoder layer")
    return states, layer_args  # type: ignore[return-value]


def _layer_paths(sk: _Skeleton, i: int) -> list[str]:
    pre = f"{sk.layers_path}.{i}."
    return [p for p in sk.names if p.startswith(pre)]


def _run_layerwise(
    sk: _Skeleton,
    ckpt: Any,
    chunks: Chunks,
    consumers: Sequence[Consumer],
    dev: str,
    dt: Any,
    head: bool,
    ctx: JobContext,
    t0: float,
) -> RunInfo:
    import torch

    n = len(sk.layers)
    mat = _Materializer(sk, ckpt, dev, dt)
    layer_prefix = sk.layers_path + "."
    head_prefix = (sk.head_path + ".") if sk.head_path else None
    outer = [
        p
        for p in sk.names
        if not p.startswith(layer_prefix) and (head or not (head_prefix and p.startswith(head_prefix)))
    ]
    if head and sk.head_path and f"{sk.head_path}.weight" not in sk.names and not sk.tied_head:
        raise SkeletonError("the checkpoint has no output head")
    # The embeddings and the head (each vocabulary × hidden in float32: 2.1 GB at Llama 3's vocabulary)
    # are held only while a pass uses them, unless a consumer reaches them through ``spec.outer``.
    # A consumer that reaches them (the scan) uses the embeddings at its start and the head at its finish,
    # not in between: an untied model's are loaded for those ends only (4.2 GB at Llama 3's vocabulary)
    keep_outer = bool(sk.tied_head)
    late = not keep_outer and any(c.uses_outer for c in consumers)
    tail: list[str] = []  # the head pass's tensors, unloaded after the consumers' finish when ``late``
    head_paths = [p for p in outer if head_prefix and p.startswith(head_prefix)]

    def load_outer(paths: Sequence[str]) -> None:
        mat.load(paths)
        if head and sk.tied_head and sk.head_path:
            # a head tied to the embeddings uses the embedding matrix itself
            emb = sk.model.get_input_embeddings()
            if emb is None or emb.weight.device.type == "meta":
                raise SkeletonError("the tied output head has no embedding matrix to share")
            _set_param(sk.model, f"{sk.head_path}.weight", emb.weight)

    load_outer(outer if keep_outer else [p for p in outer if p not in head_paths])
    mat.buffers_to_device(sk.model)
    sites: list[LinearSite] = []
    for i, layer in enumerate(sk.layers):
        sites += _sites_in(sk.model, f"{sk.layers_path}.{i}", layer, i)
    if head and sk.head_path:
        hm = sk.model.get_submodule(sk.head_path)
        sites.append(
            LinearSite(f"{sk.head_path}.weight", sk.head_path, None, hm.in_features, hm.out_features)
        )
    hidden = int(getattr(sk.model.config, "hidden_size", 0) or 0)
    spec = RunSpec(
        str(ckpt.info.path),
        RunnerMode.LAYERWISE,
        dev,
        str(dt).replace("torch.", ""),
        n,
        hidden,
        chunks.n_chunks,
        chunks.n_ctx,
        tuple(sites),
        head,
        OuterView(sk, dev, head, mat),
        RunMeter(ctx),
    )
    spec.outer.frozen = not any(c.changes_weights for c in consumers)
    prog = spec.meter
    for c in consumers:
        c.start(spec)
    # what each pass costs: the embeddings (a lookup), a chunk through layer i (twice when a consumer
    # changes weights: the outputs are computed again), a chunk through the head
    passes = 2 if any(c.changes_weights for c in consumers) else 1
    embed_cost = float(chunks.n_ctx * hidden)
    layer_cost = [_forward_cost(spec.sites_of(i), chunks.n_ctx, hidden) for i in range(n)]
    head_cost = _forward_cost(spec.sites_of(None), chunks.n_ctx, 0) if head else 0.0
    prog.plan(consumers, spec, chunks.n_chunks * (embed_cost + passes * sum(layer_cost) + head_cost))
    chunk_ref = [0]
    hooks = _Hooks(sk.model, consumers, chunk_ref)
    recomputed: list[int] = []
    peak = 0
    # the hidden states of all chunks, twice (a layer's inputs and outputs): on disk when they are large
    spool = dt == torch.float32 and spool_states(dev, chunks.n_chunks, chunks.n_ctx, hidden)

    def fresh() -> Any:
        return HiddenSpool() if spool else []

    def drop(x: Any) -> None:
        if isinstance(x, HiddenSpool):
            x.close()

    states: Any = []
    try:
        states, layer_args = _capture_inputs(sk, chunks, dev, prog, ctx, embed_cost, spool)
        if not keep_outer:
            mat.unload([p for p in outer if p not in head_paths])
        for i, layer in enumerate(sk.layers):
            ctx.check_cancelled()
            paths = _layer_paths(sk, i)
            try:
                peak = max(peak, mat.load(paths))
                mat.buffers_to_device(layer)
                rest, kwargs = layer_args[i]
                lsites = spec.sites_of(i)
                hooks.add(lsites)
                outs = fresh()
                for c in range(chunks.n_chunks):
                    ctx.check_cancelled()
                    chunk_ref[0] = c
                    out = layer(states[c], *rest, **kwargs)
                    outs.append(out[0] if isinstance(out, tuple) else out)
                    prog.step(layer_cost[i], f"layer {i + 1}/{n}: chunk {c + 1}/{chunks.n_chunks}")
                hooks.remove()
                view = LayerView(
                    i,
                    layer,
                    lsites,
                    sk.model,
                    f"{sk.layers_path}.{i}.",
                    sk.names,
                    args=(rest, kwargs),
                    inputs=states,
                )
                for cons in consumers:
                    cons.layer_collected(view)
                prog.settle(lsites)
                if view.changed:
                    recomputed.append(i)
                    drop(outs)
                    outs = fresh()
                    for c in range(chunks.n_chunks):
                        ctx.check_cancelled()
                        out = layer(states[c], *rest, **kwargs)
                        outs.append(out[0] if isinstance(out, tuple) else out)
                        if passes > 1:
                            prog.step(layer_cost[i], f"layer {i + 1}/{n}: outputs again, chunk {c + 1}")
                elif passes > 1:
                    prog.step(layer_cost[i] * chunks.n_chunks, f"layer {i + 1}/{n} done")
                for c, h in enumerate(outs):
                    _check_finite(h, f"The output of layer {i} on chunk {c + 1}")
                    for cons in consumers:
                        cons.layer_output(i, c, h)
                drop(states)
                states = outs
            except torch.OutOfMemoryError:
                raise _oom_error(dev, f"layer {i}") from None
            finally:
                hooks.remove()
                mat.unload(paths)
        if head:
            emb = sk.model.get_input_embeddings()
            emb_path = next((f"{n}." for n, m in sk.model.named_modules() if m is emb), None)
            # the head pass starts from the last hidden states: the embeddings' output is not used
            skip = [p for p in outer if not keep_outer and emb_path and p.startswith(emb_path)]
            if not keep_outer:
                load_outer([p for p in outer if p not in skip])
            if skip:
                emb.forward = lambda ids: torch.zeros((*ids.shape, hidden), dtype=dt, device=dev)
            try:
                _run_head(sk, chunks, states, consumers, hooks, spec, chunk_ref, dev, prog, ctx, head_cost)
            finally:
                if skip:
                    emb.__dict__.pop("forward", None)
            if late:
                tail = [p for p in outer if p not in skip]
            elif not keep_outer:
                mat.unload([p for p in outer if p not in skip])
    finally:
        hooks.remove()
        drop(states)
    try:
        for c in consumers:
            c.finish()
    finally:
        if tail:
            mat.unload(tail)
    prog.settle(spec.sites)
    prog.note("done")
    return RunInfo(
        RunnerMode.LAYERWISE,
        dev,
        spec.dtype,
        n,
        chunks.n_chunks,
        chunks.n_tokens,
        time.monotonic() - t0,
        tuple(recomputed),
        peak,
    )


def _run_head(
    sk: _Skeleton,
    chunks: Chunks,
    states: list[Any],
    consumers: Sequence[Consumer],
    hooks: _Hooks,
    spec: RunSpec,
    chunk_ref: list[int],
    dev: str,
    prog: RunMeter,
    ctx: JobContext,
    cost: float,
) -> None:
    """Logits from the last hidden states through the model's own final norm, head and soft-capping."""
    import torch

    current: list[Any] = [None]

    def first(*_a: Any, **_k: Any) -> Any:
        return current[0]

    def identity(*args: Any, **kwargs: Any) -> Any:
        return args[0] if args else kwargs["hidden_states"]

    if sk.head_path and sk.model.get_submodule(sk.head_path).weight.device.type == "meta":
        raise SkeletonError("the output head's weight was not loaded")
    for i, layer in enumerate(sk.layers):
        layer.forward = first if i == 0 else identity
    hooks.add(spec.sites_of(None))
    try:
        for c in range(chunks.n_chunks):
            ctx.check_cancelled()
            chunk_ref[0] = c
            current[0] = states[c]
            ids = torch.as_tensor(chunks.tokens[c : c + 1], device=dev)
            try:
                out = sk.model(input_ids=ids, use_cache=False)
            except torch.OutOfMemoryError:
                raise _oom_error(dev, "the output head") from None
            logits = out.logits[0].float()
            _check_finite(logits, f"The logits of chunk {c + 1}")
            for cons in consumers:
                cons.logits(c, logits)
            prog.step(cost, f"output head: chunk {c + 1}/{chunks.n_chunks}")
    finally:
        hooks.remove()
        for layer in sk.layers:
            layer.__dict__.pop("forward", None)


def _free_bytes(dev: str) -> int:
    if dev.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(dev))[0])

    return int(hardware.ram()[1])


def _run_whole(
    info: Any,
    chunks: Chunks,
    consumers: Sequence[Consumer],
    dev: str,
    dt: Any,
    head: bool,
    ctx: JobContext,
    t0: float,
    why: str,
) -> RunInfo:
    import torch

    blocked = [type(c).__name__ for c in consumers if c.needs_layerwise]
    if blocked:
        raise CalibrationError(
            f"{info.path.name} cannot be run layer by layer ({why}), and {blocked[0]} needs that."
        )
    need = int(info.parameters * torch.empty(0, dtype=dt).element_size())
    free = _free_bytes(dev)
    if free and need > _FIT_SHARE * free:
        raise CalibrationError(
            f"{info.path.name} cannot be run layer by layer ({why}) and its {need / 1e9:.1f} GB do not "
            f"fit in the {free / 1e9:.1f} GB free on {dev}."
        )
    model = None
    last: Exception | None = None
    for cls in _model_classes(str(info.model_type)):
        try:
            with no_hf_progress_bars():
                model = cls.from_pretrained(
                    str(info.path), dtype=dt, trust_remote_code=False, experts_implementation="eager"
                )
            break
        except Exception as err:  # noqa: BLE001 - transformers raises many kinds; one sentence below
            last = err
    if model is None:
        raise CalibrationError(
            f"transformers cannot load {info.path.name}: {str(last).splitlines()[0][:200]}"
        )
    try:
        model = model.to(dev).eval()
    except torch.OutOfMemoryError:
        raise _oom_error(dev, "loading the whole model") from None
    n_layers = int(getattr(model.config, "num_hidden_layers", 0) or 0)
    try:
        layers_path, layers = _find_layers(model, n_layers)
    except SkeletonError:
        layers_path, layers = "", []
    sites: list[LinearSite] = []
    for i, layer in enumerate(layers):
        sites += _sites_in(model, f"{layers_path}.{i}", layer, i)
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_path = (
        next((n for n, m in model.named_modules() if m is out_emb), None) if out_emb is not None else None
    )
    if head and head_path:
        sites.append(
            LinearSite(f"{head_path}.weight", head_path, None, out_emb.in_features, out_emb.out_features)
        )
    spec = RunSpec(
        str(info.path),
        RunnerMode.WHOLE_MODEL,
        dev,
        str(dt).replace("torch.", ""),
        len(layers),
        int(getattr(model.config, "hidden_size", 0) or 0),
        chunks.n_chunks,
        chunks.n_ctx,
        tuple(sites),
        head,
        meter=RunMeter(ctx),
    )
    for c in consumers:
        c.start(spec)
    prog = spec.meter
    chunk_cost = _forward_cost(sites, chunks.n_ctx, spec.hidden * len(layers))
    prog.plan(consumers, spec, chunks.n_chunks * chunk_cost)
    chunk_ref = [0]
    hooks = _Hooks(model, consumers, chunk_ref)
    hooks.add(sites)
    out_hooks = []
    for i, layer in enumerate(layers):

        def post(_m: Any, _a: Any, out: Any, i: int = i) -> None:
            h = out[0] if isinstance(out, tuple) else out
            _check_finite(h, f"The output of layer {i} on chunk {chunk_ref[0] + 1}")
            for cons in consumers:
                cons.layer_output(i, chunk_ref[0], h)

        out_hooks.append(layer.register_forward_hook(post))
    try:
        for c in range(chunks.n_chunks):
            ctx.check_cancelled()
            chunk_ref[0] = c
            ids = torch.as_tensor(chunks.tokens[c : c + 1], device=dev)
            try:
                out = model(input_ids=ids, use_cache=False)
            except torch.OutOfMemoryError:
                raise _oom_error(dev, f"chunk {c + 1}") from None
            if head and getattr(out, "logits", None) is not None:
                for cons in consumers:
                    cons.logits(c, out.logits[0].float())
            prog.step(chunk_cost, f"whole model: chunk {c + 1}/{chunks.n_chunks}")
    finally:
        hooks.remove()
        for h in out_hooks:
            h.remove()
    for c in consumers:
        c.finish()
    prog.settle(spec.sites)
    prog.note("done")
    del model
    return RunInfo(
        RunnerMode.WHOLE_MODEL,
        dev,
        spec.dtype,
        len(layers),
        chunks.n_chunks,
        chunks.n_tokens,
        time.monotonic() - t0,
        (),
        0,
    )


__all__ = [
    "Consumer",
    "LayerView",
    "LinearSite",
    "OuterView",
    "RunInfo",
    "RunMeter",
    "RunSpec",
    "RunnerMode",
    "params_on_meta",
    "run_model",
    "swapped_param",
]
