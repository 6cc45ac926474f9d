"""Shared test set-up: offscreen Qt, no network, no user settings touched."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The caller's shell must not steer the tests (a hobbyist's HF_HUB_OFFLINE=1, a token, a thread count,
# a hidden GPU): huggingface_hub and transformers latch several of these when first imported, so they
# are cleared here, before anything imports either library. A test that needs one sets it itself.
CALLER_VARIABLES = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_XET_CACHE",
    "HF_ASSETS_CACHE",
    "TRANSFORMERS_CACHE",
    "XDG_CACHE_HOME",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)
for _var in CALLER_VARIABLES:
    os.environ.pop(_var, None)
# Until pytest's own temporary folder exists (pytest_configure below), the Hugging Face and XDG caches
# point into a throw-away folder, never at the user's ~/.cache.
_ENV_HOME = tempfile.mkdtemp(prefix="qs-test-env-")


def _point_caches_at(root: Path) -> None:
    """HF_HOME, HF_HUB_CACHE and XDG_CACHE_HOME under ``root`` (created)."""
    (root / "hf_home" / "hub").mkdir(parents=True, exist_ok=True)
    (root / "xdg").mkdir(parents=True, exist_ok=True)
    os.environ["HF_HOME"] = str(root / "hf_home")
    os.environ["HF_HUB_CACHE"] = str(root / "hf_home" / "hub")
    os.environ["XDG_CACHE_HOME"] = str(root / "xdg")


_point_caches_at(Path(_ENV_HOME))


@pytest.hookimpl(trylast=True)
def pytest_configure(config) -> None:
    """Move the session's caches under pytest's temporary folder, before any test module is imported."""
    if "huggingface_hub" in sys.modules or "transformers" in sys.modules:
        return  # already latched the throw-away folder; tests/test_environment.py names the importer
    _point_caches_at(config._tmp_path_factory.getbasetemp() / "user-env")
    # Latch huggingface_hub's constants now, from this clean environment: otherwise the first test to
    # import it (say, one that monkeypatches HF_HUB_OFFLINE=1) would decide them for the whole session.
    import huggingface_hub.constants  # noqa: F401


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
    shutil.rmtree(_ENV_HOME, ignore_errors=True)


pytest_plugins = ["tests.factory_fixtures", "tests.real_fixtures"]


def _drives_ray(item) -> bool:
    return "local_cluster" in getattr(item, "fixturenames", ()) or item.get_closest_marker("ray_driver")


def pytest_collection_modifyitems(session, config, items) -> None:
    """Tests that make this process a Ray driver run last (in their collected order). Ray leaves
    process-wide state behind after ``ray.shutdown()`` (gRPC threads, its SIGTERM handler), and two
    full runs ended in a crash or a hang in the Qt tests that ran after it; no other test meets it."""
    items.sort(key=lambda item: bool(_drives_ray(item)))  # stable: every other order is kept


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """What the real-model tier spent preparing the demo and its exports (its fixed cost)."""
    from tests.real_fixtures import PREPARE_SECONDS

    if PREPARE_SECONDS:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in PREPARE_SECONDS.items())
        terminalreporter.write_line(f"real-model tier set-up: {parts}")
