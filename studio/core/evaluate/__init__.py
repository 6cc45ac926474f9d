"""Quality of quantized variants against their original: perplexity, KL divergence, same-top rate, size.

``evaluate(original, variants, text=..., n_ctx=512)`` returns an ``EvalReport`` (frozen dataclasses)
with one ``VariantScore`` per GGUF and the points of a quality-versus-size plot.
"""

from studio.core.evaluate.metrics import KLStats, kl_rows, kl_stats, log_softmax, perplexity
from studio.core.evaluate.run import EvalReport, ModelScore, QualityPoint, VariantScore, evaluate, gguf_size
from studio.core.evaluate.texts import SAMPLE_PATH, EvalText, load_text

__all__ = [
    "SAMPLE_PATH",
    "EvalReport",
    "EvalText",
    "KLStats",
    "ModelScore",
    "QualityPoint",
    "VariantScore",
    "evaluate",
    "gguf_size",
    "kl_rows",
    "kl_stats",
    "load_text",
    "log_softmax",
    "perplexity",
]
