"""Tiny random-weight checkpoints in Hugging Face layout, with real offline tokenizers, for tests and the demo.

``make_tiny_model(out_dir, "llama")`` writes config.json, safetensors weights (optionally sharded with
an index), a tokenizer trained on ``resources/text/multilingual.txt`` and a chat template, plus
``quant_studio_factory.json`` that records which input channels carry planted outliers.

Two factories and what they share: ``tokenizer`` (the tokenizer of each family), ``weights`` (the
checkpoint), ``specs`` (the architectures). Their public names are here.
"""

from __future__ import annotations

from studio.core.factory.specs import (
    ARCHITECTURES,
    DTYPES,
    FACTORY_INFO_NAME,
    GEMMA3_SLIDING_WINDOW,
    FactoryError,
    FactoryInfo,
)
from studio.core.factory.tokenizer import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    MISTRAL_TEMPLATE,
    PHI3_TEMPLATE,
    QWEN2_SPLIT_REGEX,
    TEXT_PATH,
    ZEPHYR_TEMPLATE,
    build_tokenizer,
    sample_text,
)
from studio.core.factory.weights import iter_architectures, make_tiny_model, read_factory_info

__all__ = [
    "ARCHITECTURES",
    "CHATML_TEMPLATE",
    "DTYPES",
    "FACTORY_INFO_NAME",
    "GEMMA3_SLIDING_WINDOW",
    "GEMMA_TEMPLATE",
    "MISTRAL_TEMPLATE",
    "PHI3_TEMPLATE",
    "QWEN2_SPLIT_REGEX",
    "TEXT_PATH",
    "ZEPHYR_TEMPLATE",
    "FactoryError",
    "FactoryInfo",
    "build_tokenizer",
    "iter_architectures",
    "make_tiny_model",
    "read_factory_info",
    "sample_text",
]
