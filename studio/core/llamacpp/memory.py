"""The per-machine memory of "extra buffers crashed llama.cpp here": a small JSON file in the cache.

When a llama.cpp child dies in its first decode with extra buffers on and then runs with them off,
the runner remembers that for this machine and this llama-cpp-python build, so ``auto`` starts
with them off next time. The file lives in the studio's cache folder (``QUANT_STUDIO_CACHE`` or
the platform's per-user cache); home folders shared between machines keep one entry per machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from studio.core.paths import user_cache_dir

MEMORY_NAME = "llama-extra-buffers.json"
FORMAT = 1
_MAX_BYTES = 1 << 20  # a hand-edited or hostile file larger than this is ignored


@dataclass(frozen=True)
class MachineChoice:
    """What this machine remembers about extra buffers, and why."""

    extra_buffers: bool
    reason: str
    when: float = 0.0  # time.time() of the crash


def memory_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The JSON file holding the remembered choices."""
    if cache_dir is not None:
        return Path(cache_dir) / MEMORY_NAME

    return user_cache_dir() / MEMORY_NAME


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f.read(1 << 16).splitlines():
                if line.split(":", 1)[0].strip() == "model name":
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _llama_cpp_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


def machine_key() -> str:
    """This machine and llama.cpp build: host name, CPU model, llama-cpp-python version."""
    # a new llama-cpp-python is a new native build that may have the bug fixed: it starts afresh
    return f"{platform.node()} | {_cpu_model()} | llama-cpp-python {_llama_cpp_version()}"


def _read(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _MAX_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))  # noqa: TID251 - the measurement cache is written by this module
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or not isinstance(data.get("machines"), dict)
    ):
        return {}
    return data


def remembered_choice(
    cache_dir: str | os.PathLike[str] | None = None, key: str | None = None
) -> MachineChoice | None:
    """The choice remembered for this machine, or None (nothing remembered, or an unreadable file)."""
    entry = _read(memory_path(cache_dir)).get("machines", {}).get(key or machine_key())
    if not isinstance(entry, dict) or not isinstance(entry.get("extra_buffers"), bool):
        return None
    when = entry.get("when")
    return MachineChoice(
        entry["extra_buffers"],
        str(entry.get("reason", "")),
        float(when) if isinstance(when, (int, float)) else 0.0,
    )


def _write(path: Path, data: dict[str, Any]) -> bool:
    tmp = path.with_name(f"{path.name}.partial-{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        # a read-only cache only costs the retry again next time; the run itself goes on
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def remember_choice(
    extra_buffers: bool,
    reason: str,
    cache_dir: str | os.PathLike[str] | None = None,
    key: str | None = None,
) -> Path | None:
    """Store the choice for this machine (atomically); returns the file, or None when it cannot be written."""
    path = memory_path(cache_dir)
    data = _read(path) or {"format": FORMAT, "machines": {}}
    data["machines"][key or machine_key()] = {
        "extra_buffers": bool(extra_buffers),
        "reason": reason,
        "when": time.time(),
    }
    return path if _write(path, data) else None


def forget_choice(cache_dir: str | os.PathLike[str] | None = None, key: str | None = None) -> bool:
    """Drop this machine's entry; True when there was one and the file was rewritten."""
    path = memory_path(cache_dir)
    data = _read(path)
    key = key or machine_key()
    if not data or key not in data["machines"]:
        return False
    del data["machines"][key]
    return _write(path, data)
