"""``sensitivity``, ``plan`` and ``export --budget``: the scan's JSON, a plan the export writes within the
budget to the byte, and bad input as one line (exit 2) before any calibration."""

from __future__ import annotations

import json

import pytest

from studio.cli import main

SCAN = [
    "--types",
    "Q4_0,Q8_0,Q4_K",
    "--exact",
    "--scan-ctx",
    "32",
    "--scan-chunks",
    "2",
    "--calib-ctx",
    "64",
    "--calib-chunks",
    "4",
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sensitivity"


@pytest.fixture
def text(tmp_path):
    from studio.core.factory import sample_text

    p = tmp_path / "calib.txt"
    p.write_text(sample_text(), encoding="utf-8")
    return p


def test_scan_plan_and_budget_export(llama_model, text, cache, tmp_path, capsys):
    from studio.core.gguf.read import read_gguf

    assert main(["sensitivity", str(llama_model), "--calib-text", str(text), *SCAN, "--json"]) == 0
    scan = json.loads(capsys.readouterr().out)
    assert scan["mode"] == "exact" and len(scan["tensors"]) == 16
    t = scan["tensors"][0]
    assert {"name", "role", "layer", "by_type"} <= set(t) and {"kl", "bytes"} <= set(t["by_type"]["Q4_0"])
    assert len(list(cache.glob("sensitivity-*.json"))) == 1 and len(list(cache.glob("imatrix-*.gguf"))) == 1

    # a budget halfway between all-Q4_0 and all-Q8_0
    sizes = {q: sum(x["by_type"][q]["bytes"] for x in scan["tensors"]) for q in ("Q4_0", "Q8_0")}
    budget = 100_000 + (sizes["Q4_0"] + sizes["Q8_0"]) // 2  # header and norms: under 100 kB
    plan_file = tmp_path / "plan.json"
    argv = [
        "plan",
        str(llama_model),
        "--budget",
        str(budget),
        "-o",
        str(plan_file),
        "--calib-text",
        str(text),
    ]
    assert main([*argv, *SCAN, "--json", "--measure"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["file_bytes"] <= budget and p["measured_kl"] > 0 and p["predicted_kl"] > 0
    assert {"Q4_0", "Q8_0"} <= set(p["types"]) or {"Q4_K", "Q8_0"} <= set(p["types"])  # a mixture
    assert json.loads(plan_file.read_text())["recipe"]["kind"] == "budget"

    out = tmp_path / "b.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--budget", str(budget), "--calib-text", str(text)]
    assert main([*argv, *SCAN, "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert out.stat().st_size == e["file_bytes"] == e["budget"]["file_bytes"] == p["file_bytes"]
    # `sensitivity` scanned the whole text; plan and export scan its first 75 % (the rest is held out to
    # judge the plan), and one cached scan served both
    assert len(list(cache.glob("sensitivity-*.json"))) == 2
    assert (
        p["heldout"]["heldout_kl"] > 0 and e["budget"]["heldout"]["heldout_kl"] == p["heldout"]["heldout_kl"]
    )
    g = read_gguf(out)
    assert any(k.startswith("quantize.imatrix") for k in g.metadata)  # weighted by the text's imatrix


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--budget", "100kB"], "the smallest plan needs"),
        (["--budget", "4 parsecs"], "is not a size"),
        (["--budget", "8MB", "--exclude", "Q2_K"], "which the scan did not measure"),
        (["--budget", "8MB", "--exclude", "Q4_0,Q8_0,Q4_K"], "leaves no qtype"),
        (["--budget", "8MB", "--types", "F16"], "not a quantized GGUF type"),
        (["--budget", "8MB", "--keep-first-last", "1:Q8_0"], "not with --budget"),
    ],
)
def test_bad_budget_input_is_one_line_before_any_work(
    llama_model, text, cache, tmp_path, capsys, extra, needle
):
    out = tmp_path / "x.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--calib-text", str(text), *SCAN]
    if "--types" in extra:
        argv = ["export", str(llama_model), "-o", str(out), "--calib-text", str(text)]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and needle in err[-1], err
    assert not out.exists() and not cache.parent.exists()  # refused before calibrating: nothing cached


@pytest.mark.parametrize("verb", ["plan", "export"])
def test_a_budget_above_f16_is_answered_from_the_sizes_alone(
    llama_model, text, cache, tmp_path, capsys, verb
):
    from studio.core.gguf.read import read_gguf

    out = tmp_path / ("p.json" if verb == "plan" else "f.gguf")
    argv = [verb, str(llama_model), "--budget", "1GB", "-o", str(out), "--calib-text", str(text), *SCAN]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    notes = got["notes"] if verb == "plan" else got["budget"]["notes"]
    assert "above the F16 file" in notes[0] and "every tensor stays in F16" in notes[0]
    assert not cache.parent.exists()  # answered before calibrating or scanning: nothing cached
    if verb == "plan":
        assert got["scan"] is None and set(got["types"]) <= {"F16", "F32"}
    else:
        types = {t.type_name for t in read_gguf(out).tensors}
        assert types <= {"F16", "F32"} and out.stat().st_size == got["file_bytes"]


@pytest.mark.parametrize("verb", ["plan", "export"])
def test_a_budget_for_a_converter_family_is_one_line_before_any_work(
    tiny_model, text, cache, tmp_path, capsys, verb
):
    """Granite is written through llama.cpp's converter, whose files the planner cannot size: one sentence
    that says so and what to do (it said "GGUF export does not support model type 'granite'", which export
    --preset disproves), before any calibration."""
    out = tmp_path / ("p.json" if verb == "plan" else "f.gguf")
    argv = [
        verb,
        str(tiny_model("granite")),
        "--budget",
        "3MB",
        "-o",
        str(out),
        "--calib-text",
        str(text),
        *SCAN,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: Budget plans do not cover granite yet: llama.cpp's converter writes it, and the planner cannot "
        "size its files exactly; export it with a preset or a plan file."
    )
    assert not out.exists() and not cache.parent.exists()
