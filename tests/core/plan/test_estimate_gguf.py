"""Size estimates for a GGUF original are the export's to the byte (issue 38: they were one type per
preset, "approximate", and Q3_K_M, IQ3_XS, IQ3_S and IQ3_M all came out the same)."""

from __future__ import annotations

import pytest

from studio.core.export.run import export_gguf
from studio.core.hardware import detect
from studio.core.model import open_model
from studio.core.plan.estimate import estimate_presets
from studio.core.plan.gguf_file import export_file_bytes
from studio.core.plan.plan import plan_from_preset
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of


@pytest.fixture(scope="module")
def q8_source(chat_model, gguf_of):
    """The tiny Llama as a Q8_0 GGUF: a quantized original, as hobbyists' GGUFs are."""
    return gguf_of(chat_model, "Q8_0")


@pytest.fixture(scope="module")
def estimates(q8_source):
    with open_model(q8_source) as ck:
        return {e.preset: e for e in estimate_presets(ck.info, detect(probe_torch=False), 512)}


def test_every_preset_of_a_gguf_original_is_exact_and_the_low_bit_ones_differ(estimates):
    assert all(e.exact for e in estimates.values())
    low = {p: estimates[p].file_bytes for p in ("Q3_K_M", "IQ3_XS", "IQ3_S", "IQ3_M")}
    assert len(set(low.values())) == len(low), low  # llama.cpp's mixes differ, so do their files


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q3_K_M", "IQ4_XS", "Q8_0"])
def test_the_estimate_is_the_written_file_to_the_byte(preset, q8_source, estimates, tmp_path):
    res = export_gguf(q8_source, tmp_path / f"{preset}.gguf", preset)
    assert estimates[preset].file_bytes == res.file_bytes == (tmp_path / f"{preset}.gguf").stat().st_size
    with open_model(q8_source) as ck:
        assert export_file_bytes(ck.info, plan_from_preset(ck.info, preset)) == res.file_bytes
