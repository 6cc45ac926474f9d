"""The activation-statistics consumer: per-linear ``InputStats``, per-layer ``HiddenStats``, optional Hessians.

``ActivationCollector`` is the runner consumer behind the imatrix, the inspector's activation views
and the LLM.int8() analysis. q, k and v (gate and up) read one tensor: it is reduced once and the
result added to each of them. ``ActivationStats`` is its frozen, picklable result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from studio.core.calib.accumulators import (
    HessianAccumulator,
    HiddenAccumulator,
    HiddenStats,
    InputAccumulator,
    InputStats,
    Reduction,
)
from studio.core.calib.runner import Consumer, LinearSite, RunInfo, RunSpec
from studio.core.errors import CalibrationError


@dataclass(frozen=True, eq=False)
class ActivationStats:
    """What a calibration run saw: one ``InputStats`` per linear input, one ``HiddenStats`` per layer."""

    model: str
    dataset: str
    n_ctx: int
    n_chunks: int
    sites: tuple[LinearSite, ...]
    inputs: Mapping[str, InputStats]  # site name -> statistics
    hidden: tuple[HiddenStats, ...]
    info: RunInfo | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def n_tokens(self) -> int:
        """Positions evaluated."""
        return self.n_ctx * self.n_chunks

    def site(self, name: str) -> LinearSite:
        """The site called ``name``; KeyError if none."""
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(name)

    def layer_sites(self, layer: int | None) -> tuple[LinearSite, ...]:
        """Sites of decoder layer ``layer`` (None: the head)."""
        return tuple(s for s in self.sites if s.layer == layer)

    @property
    def n_layers(self) -> int:
        """Number of decoder layers seen."""
        return len(self.hidden)

    @property
    def nbytes(self) -> int:
        """Memory held (for cache budgets); shared statistics counted once."""
        seen: dict[int, int] = {id(v): v.nbytes for v in self.inputs.values()}
        return sum(seen.values()) + sum(h.nbytes for h in self.hidden) + 1024


class ActivationCollector(Consumer):
    """Collects ``InputStats`` for every site (and ``HiddenStats`` per layer) during a run.

    ``hessian_for(site)`` selects the sites whose XᵀX is also summed (GPTQ); ``hessians()`` then
    returns ``2XᵀX/n`` per selected site. ``histogram=False`` skips the |x| histogram.
    ``hessian_dtype``: the sums' torch dtype (default float64, float32 on MPS).
    """

    def __init__(
        self,
        *,
        histogram: bool = True,
        hessian_for: Callable[[LinearSite], bool] | None = None,
        dataset: str = "",
        hessian_dtype: Any = None,
    ) -> None:
        self.histogram = histogram
        self.hessian_for = hessian_for
        self.hessian_dtype = hessian_dtype
        self.dataset = dataset
        self._spec: RunSpec | None = None
        self._acc: dict[str, InputAccumulator] = {}
        self._hess: dict[str, HessianAccumulator] = {}
        self._hidden: dict[int, HiddenAccumulator] = {}
        self._last: tuple[Any, int, int, int, Reduction] | None = None  # (x, version, chunk, expert, red)
        self._prev: tuple[InputAccumulator, HessianAccumulator | None] | None = None
        self._done: dict[str, InputStats] = {}

    def start(self, spec: RunSpec) -> None:
        """Reset and size the accumulators (lazily, per site)."""
        self._spec = spec
        self._acc.clear()
        self._hess.clear()
        self._hidden.clear()
        self._done.clear()
        self._last = None
        self._prev = None

    def _reduce(self, site: LinearSite, x: Any, chunk: int, expert: int) -> tuple[Reduction, bool]:
        last = self._last
        if (
            last is not None
            and last[0] is x
            and last[1] == x._version
            and last[2] == chunk
            and last[3] == expert
        ):
            return last[4], True
        r = Reduction.of(x, histogram=self.histogram)
        if not r.finite:
            where = f"layer {site.layer}" if site.layer is not None else "the output head"
            raise CalibrationError(
                f"The activations entering {site.name} ({where}) contain NaN or Inf values on chunk {chunk + 1}.",
                hint="Try --dtype float32, or check that layer's weights for NaN/Inf.",
            )
        # holding x keeps its memory from being reused by another tensor while we compare identities
        self._last = (x, x._version, chunk, expert, r)
        return r, False

    def observe(self, site: LinearSite, x: Any, chunk: int, expert: int = 0) -> None:
        """Add the rows entering ``site``; sites reading the same tensor share one accumulator."""
        r, again = self._reduce(site, x, chunk, expert)
        prev = self._prev
        acc = self._acc.get(site.name)
        if acc is None:
            if (
                again
                and prev is not None
                and (prev[0].n_cols, len(prev[0].count)) == (site.in_features, site.n_experts)
            ):
                acc = prev[0]
            else:
                acc = InputAccumulator(site.in_features, x.device, site.n_experts)
            self._acc[site.name] = acc
        if acc.last is not r:
            acc.add(r, expert)
            acc.last = r
        hess = None
        if self.hessian_for is not None and site.kind != "experts" and self.hessian_for(site):
            hess = self._hess.get(site.name)
            if hess is None:
                if again and prev is not None and prev[1] is not None and prev[1].n_cols == site.in_features:
                    hess = prev[1]
                else:
                    hess = HessianAccumulator(site.in_features, x.device, self.hessian_dtype)
                self._hess[site.name] = hess
            if hess.last is not r:
                hess.add(x)
                hess.last = r
        self._prev = (acc, hess)

    def layer_collected(self, view: Any) -> None:
        """Freeze the layer's statistics now: later consumers (and memory) do not need the sums."""
        self._last = None
        self._prev = None
        shared: dict[int, InputStats] = {}
        for s in view.sites:
            acc = self._acc.pop(s.name, None)
            if acc is not None:
                if id(acc) not in shared:
                    shared[id(acc)] = acc.result()
                self._done[s.name] = shared[id(acc)]

    def layer_output(self, layer: int, chunk: int, hidden: Any) -> None:
        """Follow the residual stream."""
        acc = self._hidden.get(layer)
        if acc is None:
            acc = self._hidden[layer] = HiddenAccumulator(layer, int(hidden.shape[-1]), hidden.device)
        acc.add(hidden)

    def stats_of(self, name: str) -> InputStats | None:
        """The statistics of site ``name`` so far (final once its layer is collected)."""
        if name in self._done:
            return self._done[name]
        acc = self._acc.get(name)
        return acc.result() if acc is not None else None

    def hessians(self) -> dict[str, Any]:
        """``2XᵀX/n`` (float32 numpy) per site selected by ``hessian_for``."""
        return {k: h.hessian() for k, h in self._hess.items()}

    def hessian_groups(self, names: Iterable[str]) -> list[list[str]]:
        """The named sites that have a Hessian, grouped by the input they read (one sum each), in order."""
        groups: dict[int, list[str]] = {}
        for name in names:
            acc = self._hess.get(name)
            if acc is not None:
                groups.setdefault(id(acc), []).append(name)
        return list(groups.values())

    def take_hessians(self, names: Iterable[str]) -> dict[str, tuple[Any, int]]:
        """Remove the named sites' sums and return ``(2XᵀX/n, rows)`` per site: a float32 torch tensor
        on the run's device (one tensor for sites that read the same input). A consumer that uses
        the Hessians layer by layer takes them, so memory holds one layer's, not the model's."""
        out: dict[str, tuple[Any, int]] = {}
        made: dict[int, tuple[Any, int]] = {}
        for name in names:
            acc = self._hess.pop(name, None)
            if acc is None:
                continue
            if id(acc) not in made:
                made[id(acc)] = (acc.tensor(consume=True), acc.rows)
            out[name] = made[id(acc)]
        return out

    def result(self, info: RunInfo | None = None, warnings: tuple[str, ...] = ()) -> ActivationStats:
        """The frozen statistics of the run."""
        spec = self._spec
        if spec is None:
            raise CalibrationError("The activation collector was never started.")
        inputs = dict(self._done)
        shared: dict[int, InputStats] = {}
        for k, acc in self._acc.items():  # the head, and every site of the whole-model mode
            if id(acc) not in shared:
                shared[id(acc)] = acc.result()
            inputs[k] = shared[id(acc)]
        hidden = tuple(self._hidden[i].result() for i in sorted(self._hidden))
        sites = tuple(s for s in spec.sites if s.name in inputs)
        return ActivationStats(
            spec.model, self.dataset, spec.n_ctx, spec.n_chunks, sites, inputs, hidden, info, warnings
        )


__all__ = ["ActivationCollector", "ActivationStats"]
