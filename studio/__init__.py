"""Quant Studio: inspect, plan, quantize, compare and export LLMs as GGUF on your own PC."""

__version__ = "0.1.0"
