"""The low-bit presets of the pinned llama-quantize (issue 24): IQ1_S … IQ4_XS, the IQ2_M/IQ3_M/IQ3_XS
mixes, Q2_K_S, TQ1_0/TQ2_0, Q1_0 and MXFP4_MOE.

Per tensor, the studio's preset types equal what ``llama-quantize --dry-run`` chooses (with and without
an importance matrix) on a factory model of every family, widths multiples of 256, mixtures of experts
included; the size estimates (Summary tab and ``inspect``, ``memory``, the budget planner's plan sizes)
equal the dry run's; an export equals ``llama-quantize --imatrix`` byte for byte; a plan that needs an
importance matrix and has none is refused before anything is written.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from studio.core.calib.imatrix import Imatrix, ImatrixEntry, write_imatrix
from studio.core.gguf.layout import layout
from studio.core.gguf.read import read_gguf
from studio.core.hardware import HardwareInfo
from studio.core.lab.memory import memory_report, shape_from_info
from studio.core.model import open_model
from studio.core.plan.estimate import LOW_BIT_PRESETS, estimate_preset
from studio.core.plan.imatrix_need import ImatrixRequiredError, tensor_needs_imatrix
from studio.core.plan.plan import plan_from_preset
from studio.core.plan.presets import PRESETS, allows_quantization, preset_types

LLAMA_BIN = Path(
    os.environ.get("QS_LLAMA_BIN", "/work/tools/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
)
HW = HardwareInfo("cpu", 4, 64 << 30, 32 << 30)
MIB = 1024 * 1024

# every family the factory builds (the studio's own mappings and llama.cpp's converter); their default
# widths are multiples of 256 (hidden 256, FFN 256/768/1024); llama with 8 layers so the first-eighth
# rules fire; qwen3_moe (4 experts) and mixtral (8, llama.cpp's 8-expert rules) are the MoE models
FAMILIES = {
    "llama8": ("llama", {"layers": 8}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma": ("gemma", {}),
    "gemma2": ("gemma2", {}),
    "gemma3_text": ("gemma3_text", {}),
    "phi3": ("phi3", {}),
    "gpt2": ("gpt2", {}),
    "bert": ("bert", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
    "smollm3": ("smollm3", {}),
    "qwen3_moe": ("qwen3_moe", {}),
    "mixtral": ("mixtral", {}),
    "gqa4": ("llama", {"hidden": 1024, "layers": 1, "heads": 32, "kv_heads": 8, "outliers": False}),
}

_LINE = re.compile(
    r"\]\s+(\S+)\s+- \[\s*([\d,\s]+)\], type =\s+(\S+), size =\s+([\d.]+) MiB(?: ->\s+[\d.]+ MiB \((\S+)\))?"
)
_TOTAL = re.compile(r"quant size\s*=\s*([\d.]+) MiB")


def llama_tool(name: str) -> Path:
    """A llama.cpp command-line tool of the pinned build, or skip (set QS_LLAMA_BIN to its build/bin)."""
    p = LLAMA_BIN / name
    if not p.is_file():
        pytest.skip(f"{name} is not built at {LLAMA_BIN} (set QS_LLAMA_BIN to a llama.cpp build/bin folder)")
    return p


def _row_bytes(qtype: str, ne0: int) -> int:
    # ggml's own ggml_row_size (gguf-py's table lacks Q2_0)
    from studio.core.quant.reference import ggml_row_size

    return ggml_row_size(qtype, ne0)


def dry_run(f32: Path, preset: str, imatrix: Path | None = None) -> tuple[dict[str, str], int]:
    """``llama-quantize --dry-run``'s per-tensor types (GGUF name → type) and its tensor bytes, as
    llama.cpp computes them (rows × ggml_row_size of the chosen type; unconverted tensors as they are)."""
    cmd = [str(llama_tool("llama-quantize")), "--dry-run"]
    cmd += ["--imatrix", str(imatrix)] if imatrix else []
    cmd += [str(f32), str(f32.with_suffix(".never.gguf")), preset, "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-2000:]
    types: dict[str, str] = {}
    total = 0
    for line in out.splitlines():
        m = _LINE.search(line)
        if m is None:
            continue
        name, ne, src, _, new = m.groups()
        dims = [int(d) for d in ne.split(",")]
        qtype = (new or src).upper()
        types[name] = qtype
        total += int(np.prod(dims[1:])) * _row_bytes(qtype, dims[0])
    printed = _TOTAL.search(out)
    assert printed is not None and f"{total / MIB:.2f}" == printed.group(
        1
    )  # the parse adds up as llama.cpp's
    assert not f32.with_suffix(".never.gguf").exists()
    return types, total


def synthetic_imatrix(info, out: Path) -> Path:
    """An importance matrix for every quantizable tensor of ``info`` (random positive values, per
    expert for merged experts), written as llama-imatrix's GGUF."""
    rng = np.random.default_rng(7)
    entries = {}
    for tm in layout(info).tensors:
        if not allows_quantization(tm.gguf_name, len(tm.shape)):
            continue
        n = max(1, tm.n_experts)
        sums = rng.gamma(0.7, 1.0, size=(n, tm.n_per_row)).astype(np.float32)
        entries[tm.gguf_name] = ImatrixEntry(tm.gguf_name, sums, np.full(n, 4.0, dtype=np.float32))
    write_imatrix(Imatrix(entries, datasets=("synthetic",), chunk_count=4, chunk_size=64), out)
    return out


@pytest.fixture(scope="module")
def family(request, tiny_model, exported, tmp_path_factory):
    """(HF folder, ModelInfo, the studio's F32 export, a synthetic imatrix file) of one factory family."""
    arch, kw = FAMILIES[request.param]
    model = tiny_model(arch, **kw)
    with open_model(model) as ck:
        info = ck.info
    f32 = exported(model, "F32", "F32")
    im = synthetic_imatrix(info, tmp_path_factory.mktemp("imatrix") / f"{request.param}.imatrix.gguf")
    return model, info, f32, im


@pytest.mark.parametrize("family", list(FAMILIES), indirect=True)
def test_low_bit_preset_types_and_sizes_equal_llama_quantize_dry_run(family):
    model, info, f32, im = family
    to_gguf = {t.hf_name: t.gguf_name for t in layout(info).tensors}
    shape = shape_from_info(info)
    memory = memory_report(shape, 512, "f16", HW)
    for preset in LOW_BIT_PRESETS:
        for imatrix in (None, im):
            ref, ref_bytes = dry_run(f32, preset, imatrix)
            ours = {to_gguf[k]: v for k, v in preset_types(info, preset, imatrix=imatrix is not None).items()}
            assert set(ref) - set(ours) <= {"rope_freqs.weight"}
            assert ours == {k: ref[k] for k in ours}, f"{preset} imatrix={imatrix is not None}: " + ", ".join(
                f"{k}: ours {ours[k]} llama.cpp {ref.get(k)}" for k in ours if ours[k] != ref.get(k)
            )
            # the budget planner measures plans by their summary: the preset's plan is the dry run's size
            plan = plan_from_preset(info, preset, imatrix=imatrix is not None)
            assert plan.summary(info).total_bytes == ref_bytes, (preset, imatrix)
            if imatrix is None:
                # the Summary tab, inspect (estimate_presets) and the memory table (estimate_preset)
                assert estimate_preset(info, preset, HW, 512).tensor_bytes == ref_bytes, preset
                assert memory.row(preset).weights_bytes == ref_bytes, preset
                assert memory.row(preset).bpw_source == "plan"


def test_every_llama_quantize_preset_is_offered():
    """The presets are the pinned llama-quantize's QUANT_OPTIONS, less its aliases and COPY."""
    src = LLAMA_BIN.parents[1] / "src" / "tools" / "quantize" / "quantize.cpp"
    if not src.is_file():
        src = LLAMA_BIN.parents[1] / "tools" / "quantize" / "quantize.cpp"
    if not src.is_file():
        pytest.skip(f"the pinned llama.cpp sources are not beside {LLAMA_BIN}")
    text = src.read_text()
    table = text[text.index("QUANT_OPTIONS") : text.index("};", text.index("QUANT_OPTIONS"))]
    names = set(re.findall(r'\{\s*"(\w+)",\s*LLAMA_FTYPE_', table)) - {"COPY", "Q3_K", "Q4_K", "Q5_K"}
    # every one, Q2_0 included (the installed gguf-py may not name it: studio.core.ggml_types does)
    assert set(PRESETS) == names
    llama_h = (src.parents[2] / "include" / "llama.h").read_text()
    ftypes = dict(re.findall(r"LLAMA_FTYPE_(?:MOSTLY|ALL)_(\w+)\s*=\s*(\d+)", llama_h))
    for name in names:
        assert PRESETS[name].ftype == int(ftypes[name]), name


# ------------------------------------------------------------------------- the imatrix requirement


def test_the_imatrix_rules_are_llama_quantizes_and_ggmls():
    # llama-quantize's tensor_requires_imatrix: the very low-bit types, not on token_embd/output
    for q in ("IQ3_XXS", "IQ2_S", "IQ1_M"):
        assert tensor_needs_imatrix("blk.0.attn_q.weight", q)
        assert not tensor_needs_imatrix("token_embd.weight", q) and not tensor_needs_imatrix(
            "output.weight", q
        )
    # ggml's own refusal (IQ2_XXS, IQ2_XS, IQ1_S) holds on every tensor
    for q in ("IQ2_XXS", "IQ2_XS", "IQ1_S"):
        assert tensor_needs_imatrix("token_embd.weight", q) and tensor_needs_imatrix("output.weight", q)
    # Q2_K only inside a Q2_K_S file; IQ3_S, IQ4_XS, TQ*, MXFP4, Q1_0/Q2_0 never
    assert tensor_needs_imatrix("blk.0.ffn_up.weight", "Q2_K", PRESETS["Q2_K_S"].ftype)
    assert not tensor_needs_imatrix("blk.0.ffn_up.weight", "Q2_K", PRESETS["Q2_K"].ftype)
    for q in ("IQ3_S", "IQ4_XS", "IQ4_NL", "TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "Q2_0", "Q4_K"):
        assert not tensor_needs_imatrix("blk.0.ffn_up.weight", q, PRESETS["Q2_K_S"].ftype)
    assert not tensor_needs_imatrix("blk.0.ffn_up.weight", "Q2_0", PRESETS["Q2_0"].ftype)


@pytest.mark.parametrize("preset", ["IQ2_XXS", "IQ3_XXS", "Q2_K_S", "IQ1_M"])
def test_a_preset_that_needs_an_imatrix_is_refused_before_anything_is_written(preset, llama_model, tmp_path):
    from studio.core.export.run import export_gguf

    out = tmp_path / "out" / f"{preset}.gguf"
    out.parent.mkdir()
    with open_model(llama_model) as ck:
        info = ck.info
    plan = plan_from_preset(info, preset)
    with pytest.raises(ImatrixRequiredError) as err:
        export_gguf(llama_model, out, plan)
    msg = str(err.value)
    gguf_names = {t.hf_name: t.gguf_name for t in layout(info).tensors}
    want = [
        gguf_names[n] for n, q in plan.types.items() if tensor_needs_imatrix(gguf_names[n], q, plan.ftype)
    ]
    assert want and list(err.value.tensors) == sorted(want, key=list(gguf_names.values()).index)
    assert err.value.message.count(". ") == 0 and err.value.message.endswith(".")  # one sentence
    assert want[0] in msg and f"{len(want)} tensors" in msg and "calibrate" in msg
    assert "--method imatrix" in msg  # the hint offers the calibration that makes one
    assert list(out.parent.iterdir()) == []  # nothing written, not even a partial file


def test_an_imatrix_without_the_needed_tensors_is_refused(llama_model, tmp_path):
    from studio.core.export.run import export_gguf

    with open_model(llama_model) as ck:
        info = ck.info
    plan = plan_from_preset(info, "IQ2_XXS", imatrix=True)
    partial = {"blk.0.attn_q.weight": np.ones(256, dtype=np.float32)}
    with pytest.raises(ImatrixRequiredError, match="has none for them") as err:
        export_gguf(llama_model, tmp_path / "x.gguf", plan, imatrix=partial)
    assert "blk.0.attn_q.weight" not in err.value.tensors and "blk.0.attn_k.weight" in err.value.tensors
    assert not (tmp_path / "x.gguf").exists()


def test_cli_export_refuses_in_one_sentence_and_writes_nothing(llama_model, tmp_path, capsys):
    from studio.cli import main

    out = tmp_path / "o" / "iq2.gguf"
    out.parent.mkdir()
    rc = main(["export", str(llama_model), "-o", str(out), "--preset", "IQ2_XXS"])
    err = capsys.readouterr().err
    assert rc != 0
    assert "IQ2_XXS needs an importance matrix for" in err and "calibrate" in err and "Traceback" not in err
    assert list(out.parent.iterdir()) == []


# ----------------------------------------------------------------------- whole files, byte for byte


def _read(path: Path) -> dict[str, tuple[str, bytes]]:
    """Tensor name -> (type, bytes), by the studio's bounded reader (gguf-py's GGUFReader cannot read Q2_0)."""
    g = read_gguf(path)
    with open(path, "rb") as f:
        out = {}
        for t in g.tensors:
            f.seek(t.offset)
            out[t.name] = (t.type_name, f.read(t.nbytes))
    return out


BYTE_FAMILIES = {"llama": ("llama", {}), "qwen3_moe": ("qwen3_moe", {})}


@pytest.fixture(scope="module")
def byte_family(request, tiny_model, exported, tmp_path_factory):
    """(HF folder, ModelInfo, F32 export, synthetic imatrix file) of a 2-layer dense or MoE factory model."""
    arch, kw = BYTE_FAMILIES[request.param]
    model = tiny_model(arch, **kw)
    with open_model(model) as ck:
        info = ck.info
    f32 = exported(model, "F32", "F32")
    im = synthetic_imatrix(info, tmp_path_factory.mktemp("imatrix") / f"{request.param}.imatrix.gguf")
    return model, info, f32, im


@pytest.mark.slow  # a numba compile per type and the ggml lattice setup per run: minutes in all
@pytest.mark.parametrize("preset", LOW_BIT_PRESETS)
@pytest.mark.parametrize("byte_family", list(BYTE_FAMILIES), indirect=True)
def test_low_bit_preset_exports_equal_llama_quantize_imatrix_byte_for_byte(byte_family, preset, tmp_path):
    """Widths multiples of 256, so the lattice types are written (not their IQ4_NL fallback)."""
    from studio.core.calib.imatrix import read_imatrix
    from studio.core.export.run import export_gguf

    model, info, f32, im = byte_family
    ref = tmp_path / f"ref-{preset}.gguf"
    cmd = [str(llama_tool("llama-quantize")), "--imatrix", str(im), str(f32), str(ref), preset, "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    ours = export_gguf(model, tmp_path / f"{preset}.gguf", preset, imatrix=read_imatrix(im))
    a, b = _read(ours.path), _read(ref)
    assert set(a) == set(b), preset
    for name, (t, data) in b.items():
        assert a[name][0] == t, f"{preset} {name}: {a[name][0]} vs llama.cpp {t}"
        assert a[name][1] == data, f"{preset} {name} ({t}): bytes differ from llama-quantize"
