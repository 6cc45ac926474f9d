"""The quantization lab: bit-width sweep, memory calculator, KV-cache precision, QAT and verdicts.

Each part is its own module (``sweep``, ``memory``, ``kvcache``, ``qat``, ``verdict``); import from
them directly, so that the light ones (memory, verdict) never pull in numpy-heavy or torch code.
"""
