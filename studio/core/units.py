"""Human-readable sizes, counts and durations for messages and command-line tables.

Two byte styles on purpose: decimal units (``1.54 GB``) where users compare with disks and Hub pages,
binary units (``12.3 MiB``) where they compare with RAM and VRAM. ``format_bytes`` is the one
decimal formatter of the CLI, the core's messages and the GUI (``studio.qt.fmt.human_bytes``).
"""

from __future__ import annotations

_DECIMAL_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


def format_bytes(n: float) -> str:
    """Bytes in decimal units with three significant digits (``1.54 GB``, ``15.4 MB``, ``154 KB``),
    so that sizes of every magnitude differ visibly when they differ by 1 %; plain bytes stay whole."""
    value = float(n)
    if abs(value) < 1000:
        return f"{int(value)} B"
    for unit in _DECIMAL_UNITS[1:]:
        value /= 1000
        text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        if abs(float(text)) < 1000 or unit == _DECIMAL_UNITS[-1]:  # 999.7 KB shows as 1 MB
            return f"{text} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns at the last unit


def format_mib(n: float) -> str:
    """Bytes in binary units for memory: ``71.3 MiB`` below 1 GiB, ``1.25 GiB`` from there on."""
    if n >= 1024**3:
        return f"{n / 1024**3:.2f} GiB"
    return f"{n / 1024**2:.1f} MiB"


def format_count(n: int | None) -> str:
    """A count such as downloads or parameters as ``1.5K``/``7.2B``; ``-`` when unknown."""
    if n is None:
        return "-"
    for unit, div in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def format_eta(seconds: float | None) -> str:
    """Seconds as ``1 h 05 min`` / ``3 min 20 s`` / ``12 s``, or ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"
