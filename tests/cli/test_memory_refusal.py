"""A calibrated job whose estimated peak memory is above the free RAM is refused in one sentence, before it starts."""

from __future__ import annotations

from studio.cli import main
from studio.core.plan.job_estimate import estimate_calibrated, estimate_whole


def test_gptq_export_refused_when_the_estimate_exceeds_free_ram(llama_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(10 * 1024**2))  # 10 MiB free: nothing fits
    out = tmp_path / "m.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--method", "gptq"]
    assert main([*argv, "--calib-ctx", "64", "--calib-chunks", "2"]) != 0
    text = capsys.readouterr().err
    # (the warning that GPTQ on 128 tokens fits them and little else comes first)
    err = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("[", "warning: GPTQ"))]
    assert "more than the 10.5 MB free" in err[0] and "--device cuda" in err[0]
    # torch alone takes more than 10 MB: no calibration size would fit, so none is offered
    assert "no smaller calibration would fit" in err[0] and "--calib-" not in err[0], err[0]
    assert "layer 1/" not in text and "embeddings" not in text  # refused before the run began
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_a_refusal_offers_the_largest_calibration_that_fits(llama_model, tmp_path, capsys, monkeypatch):
    """Issue 40: a refusal names what would fit. The chunks' hidden states grow with the calibration, so a
    smaller one fits a little less free RAM: the one offered fits, and twice its chunks do not."""
    from studio.core.model import open_model

    monkeypatch.setenv("QUANT_STUDIO_SPOOL_HIDDEN", "0")  # the states in RAM, as a small model's are
    with open_model(llama_model) as ck:
        cfg = dict(ck.info.config)

    def peak(ctx: int, chunks: int) -> int:
        return estimate_calibrated(cfg, ctx, chunks, hessian=True, head=True).peak_bytes

    assert peak(64, 16) > peak(64, 5) > peak(64, 4)  # the states are what grows
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(peak(64, 5)))
    out = tmp_path / "m.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--method", "gptq"]
    assert main([*argv, "--calib-ctx", "64", "--calib-chunks", "16"]) != 0
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: "))
    assert line.endswith("or run it with --device cuda or fewer chunks (--calib-chunks 4)."), line
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    # at 512 tokens a smaller context keeps more of the text: 16 chunks of 128 (2,048 tokens) over 4 of 512
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(peak(128, 16)))
    assert main([*argv, "--calib-ctx", "512", "--calib-chunks", "16"]) != 0
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: "))
    assert line.endswith("a smaller context (--calib-ctx 128 --calib-chunks 16)."), line


def test_estimate_at_llama_8b_widths_is_bounded_and_names_the_layer(monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_SPOOL_HIDDEN", "0")  # the states in RAM: counted whole
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    gptq = estimate_calibrated(cfg, 128, 2, hessian=True, head=True)
    stats = estimate_calibrated(cfg, 128, 2, hessian=False, head=False)
    # measured on one layer at these widths (bench/make_8b_fixture.py --layers 1 --vocab 8192): 4.28 GB
    assert gptq.phase == "a decoder layer" and 4.28e9 < gptq.peak_bytes < 5e9
    assert stats.phase == "embeddings" and stats.peak_bytes < 3.5e9 and stats.seconds < gptq.seconds
    more = estimate_calibrated(cfg, 512, 128, hessian=True, head=True)
    assert more.peak_bytes - gptq.peak_bytes == 2 * (512 * 128 - 256) * 4096 * 4  # the hidden states, twice
    assert estimate_calibrated(cfg, 128, 2, hessian=True, head=True, device="cuda").peak_bytes < 1e9
    monkeypatch.delenv("QUANT_STUDIO_SPOOL_HIDDEN")  # by default a CPU run spools 128 × 512 to disk
    spooled = estimate_calibrated(cfg, 512, 128, hessian=True, head=True)
    assert spooled.peak_bytes - gptq.peak_bytes == 2 * (512 - 256) * 4096 * 4 and spooled.peak_bytes < 6e9
    # the built-in text's 57 chunks of 512 spool too (in RAM their two sets put GPTQ at 6.38 GB)
    assert estimate_calibrated(cfg, 512, 57, hessian=True, head=True).peak_bytes == spooled.peak_bytes


def _refusal(capsys) -> tuple[str, str]:
    text = capsys.readouterr().err
    return next(ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[")), text


def test_a_budget_export_is_refused_before_its_first_step(llama_model, tmp_path, capsys, monkeypatch):
    """A budget export runs up to six layer-wise steps one after another; its whole run is estimated before the
    first (issue 40), so a job whose probe or judgement would not fit is not refused an hour in."""
    from studio.core.calib import budget_job
    from studio.core.calib.scan_settings import ScanSettings
    from studio.core.model import open_model

    st = ScanSettings(n_ctx=64, calib_ctx=64, calib_chunks=4)  # as --scan-ctx 64 below
    with open_model(llama_model) as ck:
        job = budget_job.budget_job(ck.info, "awq+gptq", calib_ctx=64, calib_chunks=4, settings=st)
        planned = budget_job.budget_job(
            ck.info, "imatrix", calib_ctx=64, calib_chunks=4, settings=st, export=False
        )
    assert [n for n, _ in planned.steps] == ["the calibration", "the scan", "the held-out judgement"]
    names = [n for n, _ in job.steps]
    assert names == ["the calibration", "the scan", "GPTQ's probe", "the held-out judgement", "the export",
                     "llama.cpp's last word"]  # fmt: skip
    step, est = job.peak
    assert est.peak_bytes == max(e.peak_bytes for _, e in job.steps) and job.seconds > est.seconds > 0
    # free RAM just below the peak: refused, naming the step, before any step ran
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(est.peak_bytes - 1))
    out = tmp_path / "b.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--budget", "5bpw", "--method", "awq+gptq"]
    assert main([*argv, "--calib-ctx", "64", "--calib-chunks", "4", "--scan-ctx", "64", "--no-cache"]) != 0
    line, text = _refusal(capsys)
    assert line.startswith("error: This budget export needs about") and f"({step}: {est.phase})" in line
    assert "--device cuda" in line, line
    # what it offers fits, and twice its chunks do not (the same context: one chunk of 64 is the smallest)
    k = int(line.split("--calib-chunks ")[1].split(")")[0]) if "--calib-chunks" in line else 0
    at = {n: budget_job.budget_job(ck.info, "awq+gptq", calib_ctx=64, calib_chunks=n, settings=st).peak[1]
          for n in (1, 2, 4)}  # fmt: skip
    if k:
        assert at[k].peak_bytes <= est.peak_bytes - 1 < at[2 * k].peak_bytes, (line, at)
    else:
        assert at[1].peak_bytes > est.peak_bytes - 1 and "no smaller calibration would fit" in line, (
            line,
            at,
        )
    assert "Calibrating" not in text and "layer 1/" not in text and not out.exists()
    assert not list(tmp_path.glob("*.partial"))
    plan = tmp_path / "p.json"
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(planned.peak[1].peak_bytes - 1))
    assert main(["plan", str(llama_model), "-o", str(plan), "--budget", "5bpw", "--calib-ctx", "64",
                 "--calib-chunks", "4", "--scan-ctx", "64", "--no-cache"]) != 0  # fmt: skip
    line, _ = _refusal(capsys)
    assert "This budget plan needs about" in line and not plan.exists()


def test_calibrate_refused_before_it_starts(llama_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(10 * 1024**2))
    out = tmp_path / "imatrix.gguf"
    assert main(["calibrate", str(llama_model), "-o", str(out), "--ctx", "64", "--chunks", "4"]) != 0
    line, text = _refusal(capsys)
    assert "needs about" in line and "more than the 10.5 MB free" in line and "--device cuda" in line
    assert "no smaller calibration would fit" in line and "--calib-chunks" not in line, line
    assert "layer 1/" not in text and not out.exists()


def test_sensitivity_scan_refused_before_it_starts(llama_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(10 * 1024**2))
    argv = ["sensitivity", str(llama_model), "--calib-ctx", "64", "--calib-chunks", "2", "--no-cache"]
    assert main([*argv, "-o", str(tmp_path / "scan.json")]) != 0
    line, text = _refusal(capsys)
    assert "more than the 10.5 MB free" in line and "--device cuda" in line
    assert "layer 1/" not in text and not (tmp_path / "scan.json").exists()


def test_eval_of_a_checkpoint_refused_when_it_would_not_fit_whole(llama_model, capsys, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_FREE_RAM", str(10 * 1024**2))
    argv = ["eval", "--original", str(llama_model), "--ctx", "64", "--chunks", "1", "--device", "cpu"]
    assert main([*argv, "--original-mode", "whole"]) != 0
    line, _ = _refusal(capsys)
    assert "whole needs about" in line and "10.5 MB free" in line and "--preset F16" in line
    # auto: whole does not fit, so it runs layer by layer, which is refused too at 10 MB, in its own words
    assert main(argv) != 0
    line, _ = _refusal(capsys)
    assert "layer by layer needs about" in line and "10.5 MB free" in line and "--chunks 1" in line


def test_the_scan_estimate_follows_the_runner():
    """The scan holds an untied model's embeddings and head only at its ends (the runner loads them there):
    its layers are those of a plain run, and its head phase holds the original's distribution at every
    position with the head, its bfloat16 copy and one candidate's bfloat16 difference (2 × 2.1 GB at Llama 3's
    vocabulary), or, stored in bfloat16, the float32 head until the stored one replaces it. A tied matrix
    stays loaded."""
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    embed = 128256 * 4096 * 4
    plain = estimate_calibrated(cfg, 128, 2, hessian=False, head=True)
    scan = estimate_calibrated(cfg, 128, 2, hessian=False, head=True, outer=True)
    assert plain.phase == scan.phase == "the output head"
    p = 128256 * 4  # a position's distribution; plain holds one chunk's logits (128 positions)
    assert (
        scan.peak_bytes - plain.peak_bytes == embed + (256 - 128) * p
    )  # bfloat16 copy and difference, all p
    narrow = estimate_calibrated(cfg, 128, 18, hessian=False, head=True, outer=True, narrow_head=True)
    judged = estimate_calibrated(cfg, 128, 18, hessian=False, head=True, outer=True)
    # the held-out judgement's 2,304 positions: its head phase held p (1.18 GB) with the float32 head, its
    # bfloat16 copy and a difference; a bfloat16 head's phase is under its start (embeddings and a candidate)
    assert judged.phase == "the output head" and narrow.phase == "embeddings"
    assert judged.peak_bytes - narrow.peak_bytes == 2304 * p
    tied = estimate_calibrated(
        {**cfg, "tie_word_embeddings": True}, 128, 2, hessian=True, head=True, outer=True
    )
    # the scan of a tied model holds the matrix through the layers: its layer phase is a GPTQ layer's plus it
    layers = estimate_calibrated({**cfg, "tie_word_embeddings": True}, 128, 2, hessian=True, head=True)
    assert layers.phase == tied.phase == "a decoder layer" and tied.peak_bytes - layers.peak_bytes == embed
    whole = estimate_whole(cfg, 512)
    assert 30e9 < whole.peak_bytes < 36e9 and estimate_whole(cfg, 512, dtype_bytes=2).peak_bytes < 18e9


def test_a_budget_runs_every_step_its_estimate_counts_and_none_above_it(llama_model, tmp_path, monkeypatch):
    """The whole-job estimate has a step for every layer-wise run the budget plan starts, and no run's own
    check (the runner's, before it starts) estimates more than the job's peak: a job the estimate lets
    through is not refused halfway."""
    from studio.core.calib import budget_job, runner
    from studio.core.calib.scan_settings import ScanSettings, default_types
    from studio.core.model import open_model

    seen: list[int] = []
    real = runner.estimate_calibrated

    def spy(*args, **kwargs):
        est = real(*args, **kwargs)
        seen.append(est.peak_bytes)
        return est

    monkeypatch.setattr(runner, "estimate_calibrated", spy)
    plan = tmp_path / "p.json"
    argv = ["plan", str(llama_model), "-o", str(plan), "--budget", "5bpw", "--calib-ctx", "64"]
    assert main([*argv, "--calib-chunks", "8", "--scan-ctx", "32", "--no-cache"]) == 0 and plan.is_file()
    with open_model(llama_model) as ck:
        info = ck.info
    st = ScanSettings(types=default_types(info.config), n_ctx=32, calib_ctx=64, calib_chunks=8)
    job = budget_job.budget_job(info, "imatrix", calib_ctx=64, calib_chunks=8, settings=st, export=False)
    # the calibration, the scan, and the judgement on the held-out and (another length) the scan's chunks
    assert len(seen) == 4 and len(job.steps) == 3, (seen, job.steps)
    assert max(seen) <= job.peak[1].peak_bytes
    assert set(seen) == {e.peak_bytes for _, e in job.steps}  # each run's own estimate is one of the steps'


def test_gptq_on_fewer_tokens_than_the_model_is_wide_is_warned_before_it_runs(llama_model, tmp_path, capsys):
    """GPTQ fitted on fewer tokens than the model is wide fits those tokens and little else; the 2-layer 8B
    fixture's best-method budget on 2 × 128 tokens ran two hours and llama.cpp measured 19× its prediction.
    Said before the run, with the chunks that would do (the tiny model is 256 wide)."""
    from studio.core.plan.job_estimate import thin_calibration

    cfg = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    }
    line = thin_calibration(cfg, "best", 128, 2)
    assert "256 calibration tokens" in line and "(4,096)" in line and "32 chunks of 128 tokens" in line
    assert thin_calibration(cfg, "gptq", 512, 8) == "" and thin_calibration(cfg, "awq+gptq", 512, 7) != ""
    assert thin_calibration(cfg, "awq", 128, 2) == thin_calibration(cfg, "imatrix", 128, 2) == ""

    out = tmp_path / "m.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--method", "gptq"]
    assert main([*argv, "--calib-ctx", "32", "--calib-chunks", "4"]) == 0
    err = capsys.readouterr().err
    warned = [ln for ln in err.splitlines() if ln.startswith("warning: GPTQ")]
    assert len(warned) == 1 and "128 calibration tokens, fewer than the model is wide (256)" in warned[0]
    assert "calibrate on 8 chunks of 32 tokens or more" in warned[0]
    # before the run: its first line, then the estimate, said just before the first progress line
    lines = err.splitlines()
    assert lines[0] == warned[0] and lines[1].startswith("Calibrating: about ") and lines[2].startswith("[")
    out.unlink()
    assert main([*argv, "--calib-ctx", "32", "--calib-chunks", "8"]) == 0
    assert "warning: GPTQ" not in capsys.readouterr().err


def test_a_calibrated_export_says_its_estimate_before_it_starts(llama_model, tmp_path, capsys):
    """Issue 40: the user hears the memory and time a calibrated job is expected to take before it starts,
    the line the Export dialog shows, on the command line too; a budget run says its whole run's."""
    from studio.core.calib import budget_job
    from studio.core.calib.scan_settings import ScanSettings, default_types
    from studio.core.model import open_model
    from studio.core.plan.job_estimate import calibration_estimate_line

    with open_model(llama_model) as ck:
        info = ck.info
    out = tmp_path / "m.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--calib-ctx", "32", "--calib-chunks", "8"]
    assert main([*argv, "--preset", "Q4_K_M", "--method", "awq"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == calibration_estimate_line(dict(info.config), "awq", 32, 8, "cpu")
    assert first.startswith("Calibrating: about ") and "(8 chunks of 32 tokens)." in first
    # without --calib-chunks the count is guessed from the text's size, and said so
    guess = calibration_estimate_line(dict(info.config), "awq", 32, 8, "cpu", guessed=True)
    assert guess == first.replace("(8 chunks", "(about 8 chunks")
    out.unlink()
    assert main([*argv[:4], "--preset", "Q4_K_M"]) == 0  # round to nearest: nothing calibrated, nothing said
    assert "Calibrating" not in capsys.readouterr().err
    assert (
        main(["calibrate", str(llama_model), "-o", str(tmp_path / "i.gguf"), "--ctx", "32", "--chunks", "4"])
        == 0
    )
    first = capsys.readouterr().err.splitlines()[0]
    assert first == calibration_estimate_line(dict(info.config), "imatrix", 32, 4, "cpu")

    plan = tmp_path / "p.json"
    argv = ["plan", str(llama_model), "-o", str(plan), "--budget", "5bpw", "--calib-ctx", "64"]
    assert main([*argv, "--calib-chunks", "8", "--scan-ctx", "32", "--no-cache"]) == 0 and plan.is_file()
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("Budget plan: ")]
    st = ScanSettings(types=default_types(info.config), n_ctx=32, calib_ctx=64, calib_chunks=8)
    job = budget_job.budget_job(info, "imatrix", calib_ctx=64, calib_chunks=8, settings=st, export=False)
    assert said == [f"Budget plan: {job.describe()}."]


def test_the_smaller_calibration_offered_keeps_the_most_tokens_that_fit():
    """Chunks halved, context cut to 256 or 128: the fitting size with the most tokens, the longer context on
    a tie; none when the peak does not fall with the calibration (a layer's or the head's)."""
    from studio.core.plan.job_estimate import fit_remedy, smaller_calibration

    tokens = lambda ctx, chunks: ctx * chunks  # noqa: E731  (a peak that grows with the tokens)
    assert smaller_calibration(tokens, 3000, 512, 57) == (256, 7)  # 1,792 tokens, as 14 × 128
    assert smaller_calibration(tokens, 512 * 28, 512, 57) == (512, 28)
    assert smaller_calibration(tokens, 10**9, 128, 4) == (128, 2)  # never the size asked for
    assert smaller_calibration(lambda c, k: 5_000, 4_999, 512, 57) is None
    assert fit_remedy(None, 512) == "--device cuda (no smaller calibration would fit)"
    assert fit_remedy((128, 16), 512).endswith("(--calib-ctx 128 --calib-chunks 16)")
