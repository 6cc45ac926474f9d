"""``plan --budget`` judged on held-out text: predicted, scan-chunk and held-out KL are reported, and a plan
that loses to llama.cpp's preset of the same size says so in one sentence and recommends the preset with
calibrated rounding."""

from __future__ import annotations

import dataclasses
import json

import pytest

from studio.cli import main
from tests.scan_data import synthetic_scan

CALIB = ["--calib-ctx", "64", "--calib-chunks", "4", "--scan-ctx", "32", "--scan-chunks", "2"]


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


def _misleading_scan(info, path):
    """A scan that calls Q4_0 nearly free and Q8_0 costly: its plan takes Q4_0 where a Q8_0 file fits."""
    scan = synthetic_scan(info, {"Q4_0": 1e-5, "Q8_0": 1e-2})
    path.write_text(json.dumps(dataclasses.replace(scan, model=str(info.path)).to_dict()), encoding="utf-8")


def test_a_plan_that_loses_on_heldout_text_says_so_and_recommends_the_preset(
    llama_model, text, cache, tmp_path, capsys
):
    from studio.core.calib.heldout import preset_plans
    from studio.core.model import open_model

    with open_model(llama_model) as ck:
        info = ck.info
    scan_file = tmp_path / "scan.json"
    _misleading_scan(info, scan_file)
    q8 = next(b for n, b, _ in preset_plans(info) if n == "Q8_0")
    budget = (
        q8 + 200_000
    )  # Q8_0 fits with the imatrix's metadata; no larger preset: Q8_0 is the same-size one
    argv = ["plan", str(llama_model), "--budget", str(budget), "-o", str(tmp_path / "p.json")]
    argv += ["--calib-text", str(text), "--scan", str(scan_file), *CALIB]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    h = got["heldout"]
    assert got["types"]["Q4_0"] >= 5  # the misleading scan's plan (the rest in F16, whose KL it calls 0)
    # the token embedding (and the untied head) are kept at llama.cpp's Q8_0 types for them, whatever the scan says
    assert any(
        n.startswith("Kept at least at llama.cpp's Q8_0 types (") and "token_embd.weight Q8_0" in n
        for n in got["notes"]
    ), got["notes"]
    assert h["preset"]["name"] == "Q8_0" and h["preset"]["file_bytes"] <= budget
    assert h["heldout_kl"] > h["preset"]["heldout_kl"] > 0 and h["scan_kl"] > 0 and h["heldout_tokens"] >= 256
    assert h["beats_preset"] is False and h["recommend"] == {"preset": "Q8_0", "method": "awq+gptq"}
    assert "held-out last 25 %" in h["heldout"]
    # without --json: the one sentence
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    verdict = [x for x in lines if x.startswith("No budget plan beats llama.cpp's Q8_0")]
    assert len(verdict) == 1 and "use --preset Q8_0 --method awq+gptq" in verdict[0]


def test_heldout_text_is_judged_beside_the_whole_calibration_text(llama_model, text, cache, tmp_path, capsys):
    from studio.core.factory import sample_text

    held = tmp_path / "held.txt"
    held.write_text("\n".join(reversed(sample_text().splitlines())), encoding="utf-8")
    argv = ["plan", str(llama_model), "--budget", "6bpw", "-o", str(tmp_path / "p.json")]
    argv += [
        "--calib-text",
        str(text),
        "--heldout-text",
        str(held),
        "--types",
        "Q4_0,Q8_0",
        "--exact",
        *CALIB,
    ]
    assert main([*argv, "--json"]) == 0
    h = json.loads(capsys.readouterr().out)["heldout"]
    assert (
        h["heldout"].endswith("held.txt")
        and h["heldout_kl"] > 0
        and h["scan_kl"] > 0
        and h["predicted_kl"] > 0
    )
    # --no-heldout: the whole text, no judgement
    assert main([*argv[: -len(CALIB)], "--no-heldout", *CALIB, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["heldout"] is None


def test_a_gptq_budget_plan_carries_its_method_and_is_planned_for_gptqs_rounding(
    llama_model, text, cache, tmp_path, capsys
):
    from studio.core.model import open_model

    with open_model(llama_model) as ck:
        info = ck.info
    scan_file = tmp_path / "scan.json"
    _misleading_scan(info, scan_file)
    out = tmp_path / "p.json"
    argv = ["plan", str(llama_model), "--budget", "6bpw", "-o", str(out), "--method", "best", "--no-heldout"]
    assert main([*argv, "--calib-text", str(text), "--scan", str(scan_file), *CALIB, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    # the plan file records awq+gptq, so `export --plan` rounds as planned (a budget plan used to keep "rtn")
    assert got["method"] == "awq+gptq" and json.loads(out.read_text())["method"] == "awq+gptq"
    note = next(n for n in got["notes"] if n.startswith("Planned for awq+gptq's rounding"))
    assert "Q4_0 ×" in note and "Q8_0 ×" in note
    assert len(list(cache.glob("rounding-*.json"))) == 1  # the probe is kept for the next plan


def test_a_short_text_mixed_with_the_builtin_one_says_how_much_was_yours_and_why_no_judgement(
    llama_model, cache, tmp_path, capsys
):
    # issue 37: `--method best --calib-text short.txt` (one 9-token sentence) calibrated on the built-in mix
    # almost alone and skipped the held-out judgement without a word
    from studio.core.calib.calibrate import load_tokenizer
    from studio.core.calib.data import CalibrationText, tokenize
    from studio.core.model import open_model

    with open_model(llama_model) as ck:
        info = ck.info
    scan_file = tmp_path / "scan.json"
    _misleading_scan(info, scan_file)
    short = tmp_path / "short.txt"
    short.write_text("The quick brown fox jumps over the lazy dog.\n", encoding="utf-8")
    argv = ["plan", str(llama_model), "--budget", "6bpw", "-o", str(tmp_path / "p.json"), "--method", "best"]
    argv += ["--calib-text", str(short), "--scan", str(scan_file), *CALIB]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["heldout"] is None
    (note,) = [n for n in got["notes"] if "of your text" in n]
    assert "% yours" in note and "no held-out judgement" in note and "--heldout-text" in note
    mine = int(note.split("Calibrated on ")[1].split(" tokens")[0].replace(",", ""))
    rest = int(note.split("your text and ")[1].split(" of ")[0].replace(",", ""))
    tok = load_tokenizer(llama_model)
    assert mine == len(tokenize(tok, CalibrationText("short.txt", short.read_text(encoding="utf-8"))))
    assert rest > 50 * mine  # the built-in mix is nearly all of it
    assert main(argv) == 0  # and the text output prints it once, as a note
    err = capsys.readouterr().err
    assert err.count("of your text") == 1, err


def test_a_guard_that_leaves_no_plan_is_dropped_with_a_note_not_a_refusal():
    # with IQ1_S among the presets, a budget near the smallest plan meets a same-size preset whose edge
    # types the other tensors' candidates cannot make room for: plan without the guard, and say so
    from studio.commands._heldout import allocate_guarded
    from studio.core.calib.heldout import UNGUARDED_NOTE
    from studio.core.errors import QuantizationError

    scan, guarded = object(), object()

    def allocate(sc):
        if sc is guarded:
            raise QuantizationError("A budget of 1 MB is below what these types allow.")
        return "plan"

    assert allocate_guarded(scan, guarded, "kept", allocate) == ("plan", UNGUARDED_NOTE)
    assert allocate_guarded(scan, scan, "", lambda sc: "plan") == ("plan", "")
    with pytest.raises(QuantizationError):  # no guard to drop: the budget's own refusal
        allocate_guarded(scan, scan, "", lambda sc: allocate(guarded))
