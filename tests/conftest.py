"""Shared test set-up: offscreen Qt, no network, no user settings touched."""

from __future__ import annotations

import os
import shutil
import tempfile

# Before anything imports Qt or huggingface_hub.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Demo models and converted pickles go to a throw-away cache, never the user's.
if "QUANT_STUDIO_CACHE" not in os.environ:
    _TEST_CACHE = tempfile.mkdtemp(prefix="qs-test-cache-")
    os.environ["QUANT_STUDIO_CACHE"] = _TEST_CACHE
else:
    _TEST_CACHE = None


def pytest_sessionfinish(session, exitstatus) -> None:
    """Remove the throw-away cache this run made."""
    if _TEST_CACHE:
        shutil.rmtree(_TEST_CACHE, ignore_errors=True)


pytest_plugins = ["tests.factory_fixtures", "tests.real_fixtures"]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """What the real-model tier spent preparing the demo and its exports (its fixed cost)."""
    from tests.real_fixtures import PREPARE_SECONDS

    if PREPARE_SECONDS:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in PREPARE_SECONDS.items())
        terminalreporter.write_line(f"real-model tier set-up: {parts}")
