"""``export`` prints its fallbacks as one summary line, every tensor only with ``--verbose`` (issue 26)."""

from __future__ import annotations

from studio.cli import main
from studio.commands._fallbacks import fallback_lines
from studio.core.plan.presets import Fallback


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("fallback:")]


def test_odd_rows_give_one_summary_line_and_every_tensor_with_verbose(odd_hidden_model, tmp_path, capsys):
    out = tmp_path / "q.gguf"
    assert main(["export", str(odd_hidden_model), "-o", str(out), "--preset", "Q4_K_M"]) == 0
    plain = _lines(capsys.readouterr().out)
    assert main(["export", str(odd_hidden_model), "-o", str(out), "--preset", "Q4_K_M", "--verbose"]) == 0
    verbose = _lines(capsys.readouterr().out)
    assert len(verbose) > 3  # hidden 320: every 256-block tensor falls back
    assert len(plain) == 1
    assert plain[0].startswith(f"fallback: {len(verbose)} tensors took another type (")
    assert "not a multiple of 256" in plain[0] and "--verbose" in plain[0]


def test_summary_groups_types_and_counts_the_rest():
    fb = [
        Fallback(f"t{i}", f"g{i}", "Q2_K", "Q4_0", "rows of 576 are not a multiple of 256") for i in range(5)
    ]
    fb += [Fallback("x", "x", "Q6_K", "Q8_0", "rows of 576 are not a multiple of 256")]
    (line,) = fallback_lines(fb, verbose=False)
    assert line.startswith("fallback: 6 tensors took another type (Q2_K → Q4_0 ×5, Q6_K → Q8_0 ×1)")
    assert fallback_lines([], verbose=False) == []
    assert len(fallback_lines(fb, verbose=True)) == 6
