"""Formatting of numbers for display (presentation only, no computation on model data)."""

from __future__ import annotations

from pathlib import Path

from studio.core.units import format_bytes


def human_bytes(n: int | float | None) -> str:
    """``1536000000`` -> ``"1.54 GB"``: the core's ``format_bytes``, and ``–`` when unknown."""
    return "–" if n is None else format_bytes(n)


def human_count(n: int | None) -> str:
    """``7241732096`` -> ``"7.24 B"``; small counts stay exact with thousands separators."""
    if n is None:
        return "–"
    if n < 100_000:
        return f"{n:,}"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:,}"  # pragma: no cover


def shape_text(shape: tuple[int, ...]) -> str:
    """``(4096, 11008)`` -> ``"4096 × 11008"``; a 0-d scalar shows as ``"scalar"``."""
    return " × ".join(str(d) for d in shape) if shape else "scalar"


def model_display_name(path: Path | str) -> str:
    """A short name for a model path: the repo id for a Hub cache snapshot, else the file or folder name."""
    p = Path(path)
    # Hub cache layout: .../models--org--name/snapshots/<commit>
    if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
        return p.parent.parent.name[len("models--") :].replace("--", "/")
    return p.name or str(p)


def role_text(role: object) -> str:
    """A tensor role as the plan and the CLI spell it (``Role.ATTN_Q`` -> ``"attn_q"``)."""
    return str(getattr(role, "value", role))


def home_relative(path: Path | str) -> str:
    """``/home/ana/models/x`` -> ``~/models/x``; other paths unchanged."""
    p = Path(path)
    try:
        return "~/" + p.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(p)


def enum_text(value: object) -> str:
    """Readable text for an enum member or a plain value (``Verdict.FITS_GPU`` -> ``"fits gpu"``)."""
    raw = getattr(value, "value", value)
    text = str(getattr(value, "label", "") or raw)
    return text.replace("_", " ")


def describe_hardware(hw: object, *, short: bool = False) -> str:
    """One line about the machine (a ``studio.core.hardware.HardwareInfo``): GPUs, CPU cores and RAM."""
    if hw is None:
        return "unknown hardware"
    parts: list[str] = []
    for g in getattr(hw, "gpus", ()):
        backend = str(getattr(g.backend, "value", g.backend)).upper()
        kind = "unified" if g.unified else "VRAM"
        if short:
            parts.append(
                f"{backend} {g.name} · {human_bytes(g.free_bytes)} free of {human_bytes(g.total_bytes)}"
            )
        else:
            parts.append(
                f"{backend} {g.name} ({human_bytes(g.free_bytes)} free of {human_bytes(g.total_bytes)} {kind})"
            )
    if not parts:
        parts.append("no GPU")
    ram = f"{human_bytes(hw.ram_available_bytes)} free of {human_bytes(hw.ram_total_bytes)} RAM"
    if short:
        parts.append(f"CPU {hw.cpu_cores} cores · {ram}")
    else:
        parts.append(f"{hw.cpu_name} ({hw.cpu_cores} cores), {ram}")
    return "  |  ".join(parts) if short else "; ".join(parts)
