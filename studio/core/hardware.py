"""What this machine can run on: CUDA devices, Apple MPS (unified memory) and the CPU with its RAM.

``detect()`` imports torch lazily and only when ``probe_torch`` is true; the GUI calls
``detect(probe_torch=False)`` at start-up, which reads RAM from the OS and asks ``nvidia-smi`` (if
present, with a short timeout) for CUDA devices without importing torch.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path


class Backend(str, Enum):
    """Kind of accelerator."""

    CUDA = "cuda"
    MPS = "mps"


@dataclass(frozen=True)
class GpuInfo:
    """One accelerator. For MPS, memory is the unified RAM the GPU may use."""

    index: int
    name: str
    backend: Backend
    total_bytes: int
    free_bytes: int
    unified: bool = False  # True when the GPU shares system RAM (Apple silicon)


@dataclass(frozen=True)
class HardwareInfo:
    """The devices found and how much memory they offer now."""

    cpu_name: str
    cpu_cores: int
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: tuple[GpuInfo, ...] = field(default=())
    source: str = "os"  # how GPUs were found: "torch", "nvidia-smi", "os" (none probed)

    @property
    def cuda(self) -> tuple[GpuInfo, ...]:
        """The CUDA devices."""
        return tuple(g for g in self.gpus if g.backend is Backend.CUDA)

    @property
    def gpu_free_bytes(self) -> int:
        """Memory free on all GPUs together (llama.cpp splits layers across CUDA devices)."""
        return sum(g.free_bytes for g in self.gpus)

    @property
    def has_gpu(self) -> bool:
        """Whether any accelerator was found."""
        return bool(self.gpus)

    def describe(self) -> str:
        """One line for a status bar: devices and free memory."""
        gb = 1e9  # decimal, as every size in the studio
        parts = [
            f"{g.name} ({g.free_bytes / gb:.1f}/{g.total_bytes / gb:.1f} GB free)"
            + (" [unified]" if g.unified else "")
            for g in self.gpus
        ]
        parts.append(
            f"CPU {self.cpu_cores} cores, RAM {self.ram_available_bytes / gb:.1f}/"
            f"{self.ram_total_bytes / gb:.1f} GB free"
        )
        return "; ".join(parts)


# ------------------------------------------------------------------------------------ RAM / CPU


def _meminfo(text: str) -> tuple[int, int] | None:
    vals: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            vals[key.strip()] = int(fields[0]) * 1024  # kB
    total = vals.get("MemTotal")
    if not total:
        return None
    avail = vals.get("MemAvailable", vals.get("MemFree", 0) + vals.get("Cached", 0))
    return total, avail


def _cgroup_limit(root: Path) -> tuple[int, int] | None:
    """(limit, usage) of a cgroup v2 memory controller, when a limit is set."""
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        usage = int((root / "memory.current").read_text().strip())
        return int(limit), usage
    except (OSError, ValueError):
        return None


def _ram_linux(
    proc: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")
) -> tuple[int, int] | None:
    try:
        got = _meminfo(proc.read_text())
    except OSError:
        return None
    if got is None:
        return None
    total, avail = got
    lim = _cgroup_limit(cgroup)
    if lim and lim[0] < total:  # in a container, the cgroup limit is what we can really use
        total = lim[0]
        avail = max(0, min(avail, lim[0] - lim[1]))
    return total, avail


def _ram_windows() -> tuple[int, int] | None:  # pragma: no cover - exercised on Windows only
    class MemoryStatusEx(ctypes.Structure):
        _fields_ = [
            ("dwLength", ctypes.c_ulong),
            ("dwMemoryLoad", ctypes.c_ulong),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("sullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    st = MemoryStatusEx()
    st.dwLength = ctypes.sizeof(MemoryStatusEx)
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(st)):
        return None
    return int(st.ullTotalPhys), int(st.ullAvailPhys)


def _ram_macos() -> tuple[int, int] | None:  # pragma: no cover - exercised on macOS only
    try:
        total = int(
            subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=2).stdout
        )
        out = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=2).stdout
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    page = 4096
    pages: dict[str, int] = {}
    for line in out.splitlines():
        if "page size of" in line:
            page = int("".join(c for c in line.split("page size of")[1] if c.isdigit()) or page)
        key, _, val = line.partition(":")
        val = val.strip().rstrip(".")
        if val.isdigit():
            pages[key.strip()] = int(val)
    free = sum(
        pages.get(k, 0) for k in ("Pages free", "Pages inactive", "Pages speculative", "Pages purgeable")
    )
    return total, free * page


def _ram_sysconf() -> tuple[int, int]:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * page
        except (ValueError, OSError):
            avail = total
        return total, avail
    except (ValueError, OSError, AttributeError):
        return 0, 0


def ram() -> tuple[int, int]:
    """(total, available) system RAM in bytes; (0, 0) when the OS will not say.

    ``QUANT_STUDIO_FREE_RAM`` (bytes) stands in for the available figure: tests of the memory checks
    and a user who wants to keep room for other programs set it.
    """
    fake = os.environ.get("QUANT_STUDIO_FREE_RAM", "").strip()
    if fake.isdigit():
        total, _avail = ram_of_system()
        return max(total, int(fake)), int(fake)
    return ram_of_system()


def ram_of_system() -> tuple[int, int]:
    """(total, available) system RAM in bytes as the OS says it; (0, 0) when it will not."""
    got = None
    if sys.platform.startswith("linux"):
        got = _ram_linux()
    elif sys.platform == "win32":
        got = _ram_windows()
    elif sys.platform == "darwin":
        got = _ram_macos()
    return got or _ram_sysconf()


def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_name() -> str:
    """A readable CPU model name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


# ------------------------------------------------------------------------------------------ GPUs


def _gpus_from_torch(torch, ram_total: int, ram_avail: int) -> tuple[GpuInfo, ...]:
    gpus: list[GpuInfo] = []
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(i)
                gpus.append(GpuInfo(i, torch.cuda.get_device_name(i), Backend.CUDA, int(total), int(free)))
    except RuntimeError:  # a broken driver must not stop the app
        pass
    mps = getattr(torch.backends, "mps", None)
    if not gpus and mps is not None and mps.is_available():
        gpus.append(GpuInfo(0, "Apple GPU (MPS)", Backend.MPS, ram_total, ram_avail, unified=True))
    return tuple(gpus)


def _gpus_from_nvidia_smi(timeout: float = 2.0) -> tuple[GpuInfo, ...] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return parse_nvidia_smi(out.stdout)


def parse_nvidia_smi(text: str) -> tuple[GpuInfo, ...]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            idx, name, total, free = int(parts[0]), parts[1], int(parts[2]), int(parts[3])
        except ValueError:
            continue
        gpus.append(GpuInfo(idx, name, Backend.CUDA, total * 1024**2, free * 1024**2))
    return tuple(gpus)


def detect(*, probe_torch: bool = True, use_nvidia_smi: bool = True) -> HardwareInfo:
    """Detect devices and memory now. ``probe_torch=False`` never imports torch (fast GUI start-up)."""
    total, avail = ram()
    gpus: tuple[GpuInfo, ...] = ()
    source = "os"
    if probe_torch:
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            gpus = _gpus_from_torch(torch, total, avail)
            source = "torch"
    if not gpus and not probe_torch:
        found = _gpus_from_nvidia_smi() if use_nvidia_smi else None
        if found:
            gpus, source = found, "nvidia-smi"
        elif sys.platform == "darwin" and platform.machine() == "arm64":
            # Apple silicon always has a Metal GPU sharing RAM; torch confirms it later.
            gpus = (GpuInfo(0, "Apple GPU (Metal)", Backend.MPS, total, avail, unified=True),)
    return HardwareInfo(
        cpu_name=cpu_name(),
        cpu_cores=cpu_cores(),
        ram_total_bytes=total,
        ram_available_bytes=avail,
        gpus=gpus,
        source=source,
    )
