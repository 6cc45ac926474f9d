"""Human-readable sizes, counts and durations for messages and command-line tables.

One byte style everywhere: decimal units (``1.54 GB``, ``71.3 MB``), as the Hub shows file sizes.
``format_bytes`` is the formatter of the CLI, the core's messages and the GUI
(``studio.qt.fmt.human_bytes``); ``format_memory`` is the same units with fixed decimals, for the
columns of memory tables (RAM, VRAM, KV cache) where numbers are read one under another.
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


def format_memory(n: float) -> str:
    """Bytes in decimal units with fixed decimals for memory tables: ``71.3 MB`` below 1 GB,
    ``1.25 GB`` from there on."""
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB"


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
