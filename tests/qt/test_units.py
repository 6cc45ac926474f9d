"""One unit system: every size the window and the CLI show is in decimal MB/GB, as the Hub shows them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from studio.core.hardware import Backend, GpuInfo, HardwareInfo
from studio.qt.panels.device_selector import device_choices

STUDIO = Path(__file__).resolve().parents[2] / "studio"
GIB = 1024**3


def test_device_selector_shows_decimal_gigabytes():
    hw = HardwareInfo(
        "CPU", 8, 32 * GIB, 16 * GIB, (GpuInfo(0, "RTX 4090", Backend.CUDA, 24 * GIB, 20 * GIB),)
    )
    labels = dict(device_choices(hw))
    assert labels["cuda:0"] == "CUDA 0: RTX 4090 (21.5/25.8 GB free)"


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def test_no_binary_units_in_what_the_faces_show():
    # every string literal of the window, the CLI and the core's messages (docstrings and comments may
    # explain a binary size; parse_budget still accepts "800MiB" as input): no GiB/MiB/KiB
    hits = []
    for path in STUDIO.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                text = node.value.replace("800MiB", "")
                if re.search(r"\b(GiB|MiB|KiB)\b", text):
                    hits.append(f"{path.relative_to(STUDIO)}:{node.lineno}: {node.value[:80]!r}")
    assert not hits, hits
