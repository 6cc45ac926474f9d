"""Calibrated quantization's tensors as independent units: each tensor of a layer given its Hessian.

Within one decoder layer the tensors' GPTQ/AWQ roundings do not depend on each other (the next layer
needs all of them, so layers stay in order). When a layer is collected the head prepares every
tensor's inputs exactly as in process (AWQ's scales applied to the imatrix and the Hessian), puts each
Hessian into the object store once for the layer (tensors fed by the same input share it) and runs the
roundings as units; the consumer then spools and applies them in the layer's order, as in process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from studio.core.calib.quantize import SiteStats, rescaled_hessian
from studio.core.executor import Executor, Unit
from studio.core.jobs import null_context
from studio.core.quant.gptq import HessianError
from studio.core.quant.methods import imatrix, method_info


def round_layer(consumer: Any, executor: Executor, sites: Sequence[Any], view: Any, hess: dict[str, Any],
                scales: dict[str, Any]) -> dict[str, tuple[Any, str]]:  # fmt: skip
    """Site name → (encoding, method that ran) for every quantized site of the layer, run as units."""
    import torch

    units, names = [], []
    shared: dict[int, Any] = {}
    for site in sites:
        qtype = consumer._qtype(site.name)
        if qtype is None:
            continue
        w = view.weight(site).detach().to(torch.float32)
        if site.kind == "conv1d":
            w = w.t()
        w = w.contiguous().cpu()
        method = consumer._method(site.name)
        st = consumer.collector.stats_of(site.name)
        imx = None if st is None else st.mean_sq[0].astype(np.float32)
        h = hess.get(site.name)
        hmat = None if h is None else h[0]
        s = scales.get(site.name)
        if s is not None:  # the layer's input is x / s now (as MethodConsumer._site)
            sn = s.double().cpu().numpy()
            imx = None if imx is None else (imx / sn**2).astype(np.float32)
            if hmat is not None:
                hmat = rescaled_hessian(hmat, s)
            href = None if hmat is None else executor.share(hmat.cpu())
        elif hmat is None:
            href = None
        else:
            key = id(hmat)
            if key not in shared:  # once per layer, whatever number of tensors read it
                shared[key] = executor.share(hmat.cpu())
            href = shared[key]
        stats = SiteStats(site.name, st.tokens if st else 0, imx, None, consumer.options.gptq)
        units.append(Unit((w, stats, href, qtype, method.name), 1, site.name))
        names.append(site.name)
    out: dict[str, tuple[Any, str]] = {}
    n = consumer.spec.n_layers if consumer.spec else 0
    for i, (enc, used, note) in executor.run(
        round_unit, units, _Silent(consumer.ctx), what=f"tensors of layer {view.index + 1}/{n}"
    ):
        out[names[i]] = (enc, used)
        if note:
            consumer._note(note)
    return out


class _Silent:
    """Cancel goes through; the consumer's span keeps its own per-layer progress."""

    def __init__(self, parent: Any) -> None:
        self._parent = parent

    def report(self, done: int, total: int, msg: str = "") -> None:
        self._parent.say(msg)

    def check_cancelled(self) -> None:
        self._parent.check_cancelled()

    @property
    def cancelled(self) -> bool:
        return self._parent.cancelled


def round_unit(w: Any, stats: Any, hessian: Any, qtype: str, method: str) -> tuple[Any, str, str]:
    """One tensor's rounding (a worker): (encoding, method that ran, note or "")."""
    if type(hessian).__name__ == "ObjectRef":
        import ray

        hessian = ray.get(hessian)
    stats = dataclasses.replace(stats, hessian=hessian)
    m = method_info(method)
    try:
        return m.rounding(w, stats, qtype, null_context()), m.name, ""
    except HessianError as err:
        note = f"{stats.name}: {err} It was quantized with the imatrix search instead."
        return imatrix(w, stats, qtype, null_context()), "imatrix", note


__all__ = ["round_layer", "round_unit"]
