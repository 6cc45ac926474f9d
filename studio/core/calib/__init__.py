"""Calibration: one sequential layer runner that every activation-based feature consumes.

Pipeline::

    text ──data.load_calibration──▶ CalibrationText ──tokenize/make_chunks──▶ Chunks (n_chunks × n_ctx)
         ──runner.run_model(checkpoint, chunks, [consumer, ...])──▶ consumers' results

``run_model`` embeds the chunks, then materialises the decoder layers one at a time from the
checkpoint (a meta-device skeleton plus that layer's weights on CUDA, MPS or CPU), runs every chunk
through the layer with a pre-hook on each linear's input, and feeds the layer's outputs to the next
layer. Peak memory is one layer's weights, the hidden states of all chunks (twice, in and out) and a
constant; progress is reported per layer and chunk with an ETA, and cancellation is checked per chunk.

The consumer interface (``runner.Consumer``; every method is optional)::

    start(spec: RunSpec)                        sites (LinearSite per matrix product), layers, chunks
    observe(site, x, chunk, expert=0)           rows x (tokens × in_features) entering ``site``
    layer_collected(view: LayerView)            all chunks went through layer ``view.index``; its
                                                weights are on the device: ``view.weight(site)``,
                                                ``view.set_weight(site, w)``; after a change the
                                                runner recomputes the layer's outputs with the new
                                                weights, so the next layer's inputs come from the
                                                changed (e.g. already quantized) layer
    layer_output(layer, chunk, hidden)          what the layer passes on
    logits(chunk, logits)                       when a consumer sets ``wants_head``: the model's own
                                                final norm, head and soft-capping on the last states
    finish()

    needs_layerwise = True                      refuse the whole-model fallback (it cannot change
                                                weights between layers)

How the planned methods sit on it:

* activation statistics and the imatrix: ``collect.ActivationCollector`` (count, Σx², absmax, Σ|x|,
  log-binned |x| histogram per linear input, hidden-state norms per layer), then
  ``imatrix.imatrix_from_stats``; ``calibrate.calibrate`` runs and caches it.
* GPTQ (issue 14): ``ActivationCollector(hessian_for=...)`` sums XᵀX per linear (``H = 2XᵀX/n``,
  ``collector.hessians()``); a GPTQ consumer placed after it quantizes each linear in
  ``layer_collected`` with ``view.set_weight`` (``needs_layerwise = True``), so the next layer is
  calibrated on the quantized layer's outputs. AWQ: the same, scaling with ``InputStats.mean_abs``.
* Sensitivity (issue 15): a consumer with ``wants_head = True`` keeps the original's logits per chunk
  (``logits``); a second run whose consumer replaces one tensor's weight in ``layer_collected``
  gives the KL of that tensor against the original.
* LLM.int8() analysis: ``int8.Int8Analysis`` (after the collector), which needs the real weights
  and activations while a layer is on the device.

The views' functions (channel profile, activation histogram, AWQ saliency, SmoothQuant, per-layer
outlier counts) are in ``analysis``.
"""

from studio.core.calib.accumulators import HessianAccumulator, HiddenStats, InputStats
from studio.core.calib.calibrate import calibrate, prepare_input
from studio.core.calib.collect import ActivationCollector, ActivationStats
from studio.core.calib.data import BUILTIN, CalibrationText, Chunks
from studio.core.calib.imatrix import (
    Imatrix,
    check_for_model,
    imatrix_from_stats,
    read_imatrix,
    write_imatrix,
)
from studio.core.calib.runner import Consumer, LayerView, LinearSite, RunInfo, RunnerMode, RunSpec, run_model
from studio.core.errors import CalibrationError

__all__ = [
    "BUILTIN",
    "ActivationCollector",
    "ActivationStats",
    "CalibrationError",
    "CalibrationText",
    "Chunks",
    "Consumer",
    "HessianAccumulator",
    "HiddenStats",
    "Imatrix",
    "InputStats",
    "LayerView",
    "LinearSite",
    "RunInfo",
    "RunSpec",
    "RunnerMode",
    "calibrate",
    "check_for_model",
    "imatrix_from_stats",
    "prepare_input",
    "read_imatrix",
    "run_model",
    "write_imatrix",
]
