"""Does this CPU have Intel AMX? From the kernel's CPU flags on Linux, else from llama.cpp itself.

llama.cpp's AMX extra buffer type is the one that crashes (llama.cpp #20824), so AMX decides the
``auto`` default of extra buffers. Linux lists the flags in ``/proc/cpuinfo`` (no native code
runs); elsewhere the llama.cpp child reports the features its CPU backend uses
(``llama_print_system_info``: ``AMX_INT8 = 1``), which is what matters there.
"""

from __future__ import annotations

import re
from pathlib import Path

AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")
_MAX_CPUINFO = 4 << 20  # a machine with hundreds of cores writes a few hundred kB


def amx_in_cpuinfo(text: str) -> bool:
    """Whether any ``flags`` line of a ``/proc/cpuinfo`` text names an AMX feature."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and AMX_FLAGS & set(value.split()):
            return True
    return False


def amx_in_system_info(text: str) -> bool:
    """Whether llama.cpp's system-info line says its CPU backend uses AMX (``AMX_INT8 = 1``)."""
    return re.search(r"\bAMX[A-Z0-9_]*\s*=\s*1\b", text) is not None


def cpu_has_amx(cpuinfo: Path = CPUINFO) -> bool | None:
    """True/False from the kernel's CPU flags; None where there are none to read (not Linux)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            text = f.read(_MAX_CPUINFO)
    except OSError:
        return None
    if "flags" not in text:
        return None  # e.g. ARM Linux says "Features"; there is no AMX to find there
    return amx_in_cpuinfo(text)
