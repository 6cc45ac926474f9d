"""Human-readable numbers and the CLI's shared output helpers."""

from __future__ import annotations

import io
import json

import pytest

from studio.commands._common import ProgressLine, print_json, read_text, write_text
from studio.core.errors import StudioError
from studio.core.units import format_bytes, format_count, format_eta, format_memory


def test_format_bytes_decimal_units_three_significant_digits():
    assert format_bytes(0) == "0 B"
    assert format_bytes(999) == "999 B"
    assert format_bytes(263_992) == "264 KB"
    assert format_bytes(1_300_000) == "1.3 MB"
    assert format_bytes(1_536_000_000) == "1.54 GB"  # the GUI's style: 1.54 and 1.50 GB differ
    assert format_bytes(15_360_000) == "15.4 MB"
    assert format_bytes(60e9) == "60 GB"
    assert format_bytes(999_700) == "1 MB"  # rounding up moves to the next unit, never "1000 KB"
    assert format_bytes(5e18) == "5000 PB"


def test_format_memory_decimal_units_with_fixed_decimals():
    # one unit system: decimal MB/GB as the Hub shows them, never MiB/GiB
    assert format_memory(8 * 1024**2) == "8.4 MB"
    assert format_memory(999_999_999) == "1000.0 MB"
    assert format_memory(1_250_000_000) == "1.25 GB"
    assert format_memory(1024**3) == "1.07 GB"


def test_format_count_and_eta():
    assert (format_count(None), format_count(800), format_count(1500), format_count(7_241_000_000)) == (
        "-",
        "800",
        "1.5K",
        "7.2B",
    )
    assert (format_eta(None), format_eta(12.4), format_eta(200), format_eta(3900)) == (
        "?",
        "12 s",
        "3 min 20 s",
        "1 h 05 min",
    )


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_rewrites_on_a_terminal_and_ends_before_errors():
    s = _Tty()
    with pytest.raises(RuntimeError), ProgressLine(width=20, interval=0.0, stream=s) as line:
        line.fraction(1, 4, "one")
        line.fraction(4, 4, "done")
        raise RuntimeError("boom")
    # the line is finished even though the work failed, so "error: ..." starts on its own line
    assert s.getvalue() == "\r" + "[ 25.0%] one".ljust(20) + "\r" + "[100.0%] done".ljust(20) + "\n"


def test_progress_line_in_a_log_is_plain_throttled_lines():
    s = io.StringIO()
    with ProgressLine(interval=3600, stream=s) as line:
        line.fraction(1, 10, "a")
        line.fraction(2, 10, "dropped: too soon")
        line.log("a note")
        line.fraction(10, 10, "final always shows")
    assert s.getvalue().splitlines() == ["[ 10.0%] a", "a note", "[100.0%] final always shows"]


def test_print_json_and_small_files(tmp_path, capsys):
    print_json({"a": [1, 2]})
    assert json.loads(capsys.readouterr().out) == {"a": [1, 2]}
    p = tmp_path / "plan.json"
    write_text(p, "{}", "plan")
    assert read_text(p, "plan") == "{}" and not (tmp_path / "plan.json.partial").exists()
    with pytest.raises(StudioError, match="Cannot write the plan .*missing"):
        write_text(tmp_path / "missing" / "p.json", "{}", "plan")
    with pytest.raises(StudioError, match="Cannot write the plan"):
        write_text(tmp_path, "{}", "plan")
    with pytest.raises(StudioError, match=r"The plan .*nope\.json cannot be read"):
        read_text(tmp_path / "nope.json", "plan")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")
    with pytest.raises(StudioError, match="not UTF-8"):
        read_text(tmp_path / "bin.json", "plan")


def test_format_table_widths_follow_the_widest_cell():
    from studio.commands._common import format_table

    text = format_table(
        ("MODEL", "SIZE", "NOTE"), [("a/b", "1.0 KB", "x"), ("org/long-name", "12 B", "")], right=(1,)
    )
    assert text.splitlines() == [
        "MODEL            SIZE  NOTE",
        "a/b            1.0 KB  x",
        "org/long-name    12 B  ",
    ]
