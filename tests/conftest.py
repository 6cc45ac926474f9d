"""Shared test set-up: offscreen Qt, no network, no user settings touched."""

from __future__ import annotations

import os

# Before anything imports Qt or huggingface_hub.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["tests.factory_fixtures"]
