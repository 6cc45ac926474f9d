"""Hardware detection: RAM from the OS (with cgroup limits), CUDA/MPS through fakes, no torch when asked."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from studio.core import hardware
from studio.core.hardware import Backend, GpuInfo, HardwareInfo, detect, parse_nvidia_smi

GIB = 1024**3


def test_detect_on_this_machine_reports_ram_and_cores():
    hw = detect(probe_torch=False, use_nvidia_smi=False)
    assert hw.cpu_cores >= 1
    assert hw.ram_total_bytes > 0
    assert 0 < hw.ram_available_bytes <= hw.ram_total_bytes
    assert "CPU" in hw.describe()


def test_probe_torch_false_never_imports_torch():
    code = (
        "import sys; from studio.core.hardware import detect; "
        "hw = detect(probe_torch=False); "
        "import studio.core.model, studio.core.plan.estimate; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_meminfo_and_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n"
    )
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text("max\n")
    assert hardware._ram_linux(meminfo, cg) == (16000000 * 1024, 8000000 * 1024)
    (cg / "memory.max").write_text(str(4 * GIB))
    (cg / "memory.current").write_text(str(3 * GIB))
    assert hardware._ram_linux(meminfo, cg) == (4 * GIB, 1 * GIB)


def _fake_torch(cuda_devices=(), mps=False):
    cuda = types.SimpleNamespace(
        is_available=lambda: bool(cuda_devices),
        device_count=lambda: len(cuda_devices),
        mem_get_info=lambda i: (cuda_devices[i][1], cuda_devices[i][2]),
        get_device_name=lambda i: cuda_devices[i][0],
    )
    backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps))
    return types.SimpleNamespace(cuda=cuda, backends=backends)


def test_cuda_devices_through_fake_torch(monkeypatch):
    fake = _fake_torch([("NVIDIA RTX 4090", 20 * GIB, 24 * GIB), ("NVIDIA RTX 3060", 11 * GIB, 12 * GIB)])
    monkeypatch.setitem(sys.modules, "torch", fake)
    hw = detect()
    assert hw.source == "torch"
    assert [g.name for g in hw.gpus] == ["NVIDIA RTX 4090", "NVIDIA RTX 3060"]
    assert hw.gpus[0] == GpuInfo(0, "NVIDIA RTX 4090", Backend.CUDA, 24 * GIB, 20 * GIB)
    assert hw.gpu_free_bytes == 31 * GIB
    assert len(hw.cuda) == 2
    assert "RTX 4090 (21.5/25.8 GB free)" in hw.describe()  # decimal units, as everywhere


def test_mps_is_unified_memory(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(mps=True))
    monkeypatch.setattr(hardware, "ram", lambda: (32 * GIB, 20 * GIB))
    hw = detect()
    (g,) = hw.gpus
    assert g.backend is Backend.MPS and g.unified
    assert (g.total_bytes, g.free_bytes) == (32 * GIB, 20 * GIB)


def test_no_gpu_with_cpu_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    hw = detect()
    assert hw.gpus == () and not hw.has_gpu


def test_broken_cuda_driver_does_not_raise(monkeypatch):
    fake = _fake_torch([("X", 1, 2)])

    def boom(i):
        raise RuntimeError("CUDA driver version is insufficient")

    fake.cuda.mem_get_info = boom
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert detect().gpus == ()


def test_nvidia_smi_parsing_and_path(monkeypatch):
    text = "0, NVIDIA H100 80GB HBM3, 81559, 80000\n1, NVIDIA A10, 23028, 100\ngarbage line\n"
    gpus = parse_nvidia_smi(text)
    assert [(g.index, g.name, g.total_bytes, g.free_bytes) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 81559 * 1024**2, 80000 * 1024**2),
        (1, "NVIDIA A10", 23028 * 1024**2, 100 * 1024**2),
    ]
    monkeypatch.setattr(hardware, "_gpus_from_nvidia_smi", lambda timeout=2.0: gpus)
    hw = detect(probe_torch=False)
    assert hw.source == "nvidia-smi" and len(hw.gpus) == 2


def test_hardware_info_is_frozen():
    hw = HardwareInfo("cpu", 4, 8 * GIB, 4 * GIB)
    with pytest.raises(AttributeError):
        hw.cpu_cores = 8  # type: ignore[misc]
