"""The demo model's facts the window shows (its name, question and outlier channel), apart from
``studio.core.demo`` so that the window reads them without importing the GGUF reader."""

from __future__ import annotations

__all__ = ["DEMO_NAME", "DEMO_OUTLIER_CHANNEL", "DEMO_QUESTION", "DEMO_TENSOR"]

DEMO_NAME = "SmolLM2-135M-Instruct"
DEMO_QUESTION = "What is the capital of France?"
"""The question the demo answers ("The capital of France is Paris.") and its Q2_K export does not."""

DEMO_TENSOR = "model.layers.27.mlp.gate_proj.weight"
"""What the demo opens on: input channel 260 of this matrix is about 12 times the median channel
(absmax 9.3), the strongest real outlier channel of the model's MLPs."""

DEMO_OUTLIER_CHANNEL = 260
