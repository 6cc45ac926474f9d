"""llama.cpp's converter as the architecture layer: the GGUF layout it gives a checkpoint (names,
shapes, roles, sources), cached per checkpoint files. The run itself is ``converter_run``; what the
converter names and knows is ``converter_roles``; their public names are here too.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any

from studio.core.errors import ExportError
from studio.core.gguf.arch import Layout, TensorMap, Transform
from studio.core.gguf.converter_roles import (
    converter_knows,
    gguf_layer,
    gguf_role,
    hf_architecture,
    role_table,
    unknown_architecture_error,
)
from studio.core.gguf.converter_run import (
    ConvertedTensor,
    ConverterRun,
    reference_convert,
    start_run,
)
from studio.core.modelinfo import ModelInfo, rotation_config

# ----------------------------------------------------------------------------------- layouts


def _cache_key(info: ModelInfo) -> tuple[Any, ...]:
    folder = info.path if info.path.is_dir() else info.path.parent
    stamp = []
    for f in sorted({t.file for t in info.tensors} | {folder / "config.json"}):
        with contextlib.suppress(OSError):
            st = os.stat(f)
            stamp.append((str(f), st.st_size, st.st_mtime_ns))
    rotation = tuple(sorted(rotation_config(info).items()))  # a rotated view's layout is its own
    return (str(info.path), tuple(stamp), rotation)


@functools.lru_cache(maxsize=8)
def _layout_cached(key: tuple[Any, ...], info_box: _Box) -> Any:
    return _build_layout(info_box.info)


@dataclass(frozen=True, eq=False)
class _Box:
    info: ModelInfo

    def __hash__(self) -> int:  # the cache key carries identity; the box only carries the info
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Box)


def converter_layout(info: ModelInfo) -> Any:
    """The GGUF layout llama.cpp's converter gives ``info`` (names, shapes, roles, sources), cached
    per checkpoint files; ExportError when the converter cannot convert it."""
    return _layout_cached(_cache_key(info), _Box(info))


def _build_layout(info: ModelInfo) -> Any:
    run = start_run(info)
    tensors = list(run.tensors.values())
    # a checkpoint tensor feeding exactly one GGUF tensor, alone, keeps its own name as the plan
    # key (so the inventory and the plan line up); merged or split ones are keyed by GGUF name
    uses: dict[str, int] = {}
    for t in tensors:
        for s in t.sources:
            uses[s] = uses.get(s, 0) + 1
    maps = []
    for t in tensors:
        if t.dtype not in ("F32", "F16"):
            raise ExportError(
                f"{run.conv.bundle.label} writes tensor {t.name} of {info.path.name} as {t.dtype}, "
                "which the studio cannot plan yet."
            )
        key = t.sources[0] if len(t.sources) == 1 and uses[t.sources[0]] == 1 else t.name
        maps.append(
            TensorMap(
                key,
                t.name,
                t.shape,
                Transform.CONVERTER,
                gguf_layer(t.name),
                role=gguf_role(t.name),
                sources=t.sources,
            )
        )
    used = set(uses)
    skipped = tuple(t.name for t in info.tensors if t.name not in used)
    names = {t.name for t in tensors}
    return Layout(
        run.gguf_arch,
        tuple(maps),
        skipped,
        "output.weight" not in names,
        source="llama.cpp",
        params=dict(run.arch_params()),
    )


__all__ = [
    "ConvertedTensor",
    "ConverterRun",
    "converter_knows",
    "converter_layout",
    "gguf_layer",
    "gguf_role",
    "hf_architecture",
    "reference_convert",
    "role_table",
    "start_run",
    "unknown_architecture_error",
]
