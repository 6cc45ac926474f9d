"""The core must stay GUI-free: importing any studio.core module pulls in no Qt."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import studio.core


def _core_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(studio.core.__path__, "studio.core.")]


def test_core_imports_no_qt() -> None:
    mods = _core_modules()
    assert mods, "no core modules found"
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6')"
        " or n.startswith('studio.qt'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"studio.core imported Qt: {out.stdout.strip()}"


def test_core_sources_never_name_qt() -> None:
    import pathlib

    root = pathlib.Path(studio.core.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            s = line.strip()
            if s.startswith(("import ", "from ")) and any(
                q in s.split()[1] for q in ("PySide6", "pyqtgraph", "shiboken6", "studio.qt")
            ):
                offenders.append(f"{path.name}: {s}")
    assert not offenders, offenders
