"""Statistics over tensors: quantization error metrics and friends."""

from studio.core.quant.metrics import ErrorMetrics, error_metrics

__all__ = ["ErrorMetrics", "error_metrics"]
