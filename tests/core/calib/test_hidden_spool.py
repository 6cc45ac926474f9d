"""Hidden states spooled to disk (issue 40): the layer runner keeps a large set of per-chunk states in an
unlinked temporary file, one chunk in RAM at a time, and computes exactly what it computes in RAM."""

from __future__ import annotations

import pytest

from studio.cli import main
from studio.core.calib import hidden_spool
from studio.core.calib.hidden_spool import HiddenSpool, spool_states
from studio.core.errors import CalibrationError


def test_a_spool_reads_back_what_was_written_and_leaves_no_file(tmp_path):
    import torch

    sp = HiddenSpool(tmp_path)
    xs = [torch.randn(1, 7, 5) for _ in range(3)]
    for x in xs:
        sp.append(x)
    assert len(sp) == 3 and list(tmp_path.iterdir()) == []  # the file has no name
    assert all(torch.equal(a, b) for a, b in zip(sp, xs, strict=True))
    assert torch.equal(sp[-1], xs[2])
    with pytest.raises(IndexError):
        sp[3]
    with pytest.raises(CalibrationError, match="do not match"):
        sp.append(torch.randn(1, 6, 5))
    sp.close()
    assert list(tmp_path.iterdir()) == []


def test_a_spool_in_a_missing_folder_is_one_sentence(tmp_path):
    import torch

    sp = HiddenSpool(tmp_path / "gone")
    with pytest.raises(CalibrationError, match="Could not make a file for the hidden states"):
        sp.append(torch.zeros(1, 2, 2))


def test_when_a_run_spools(monkeypatch):
    monkeypatch.delenv("QUANT_STUDIO_SPOOL_HIDDEN", raising=False)
    # 8B widths: 128 chunks of 512 tokens (1.07 GB a set) and the built-in text's 57 (0.48 GB) spool on a
    # CPU; 2 of 128 do not, nor the 1.5B bench model's 57 of 512 (0.18 GB); a GPU never
    assert spool_states("cpu", 128, 512, 4096) and not spool_states("cpu", 2, 128, 4096)
    assert spool_states("cpu", 57, 512, 4096) and not spool_states("cpu", 57, 512, 1536)
    assert not spool_states("cuda", 128, 512, 4096)
    monkeypatch.setenv("QUANT_STUDIO_SPOOL_HIDDEN", "1")
    assert spool_states("cpu", 1, 8, 8)


def test_a_spooled_gptq_export_writes_the_same_bytes(llama_model, tmp_path, monkeypatch):
    """GPTQ (whose layers change weights, so outputs are computed twice) through a spool and in RAM."""
    made = []
    real = HiddenSpool.append

    def counted(self, t):
        made.append(1)
        return real(self, t)

    monkeypatch.setattr(hidden_spool.HiddenSpool, "append", counted)
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("QUANT_STUDIO_SPOOL_HIDDEN", flag)
        out = tmp_path / f"m{flag}.gguf"
        argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--method", "gptq"]
        assert main([*argv, "--calib-ctx", "64", "--calib-chunks", "3"]) == 0
        outs.append(out.read_bytes())
        if flag == "1":
            assert made, "the run did not spool"
            n_spooled = len(made)
    assert len(made) == n_spooled  # the in-RAM run made none
    assert outs[0] == outs[1]
