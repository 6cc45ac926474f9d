"""Peak memory and time of a streamed GGUF export of a model with ~1.5 GB of weights.

Generates a Llama-shaped checkpoint (float32 safetensors written tensor by tensor, so generating it
needs little memory either), then in separate processes:

1. exports it to Q4_K_M with the studio back end (the measured run: peak RSS must stay < 600 MB),
2. exports it to F32 GGUF (input for the reference),
3. runs llama.cpp's own ``llama_model_quantize`` (Q4_K_M) on that F32 file: the reference time.

Usage: ``python bench/export_memory.py [--dir DIR] [--layers 8] [--hidden 2048] [--keep]``

``--moe``: a Qwen3-MoE-shaped checkpoint instead (64 experts per layer by default), exported through
llama.cpp's converter. Printed: the peak RSS growth of the studio's export over the same process
just before it (converter loaded, layout known) against the size of one merged expert tensor
(experts x rows x columns in float32): the streaming must stay within that plus a constant; and,
as the reference, the converter's own F32 conversion of the same checkpoint (its own writer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _tokenizer_and_config(folder: Path, arch: str) -> tuple[dict, int]:
    """Copy a small trained tokenizer of ``arch`` into ``folder``; its config and vocabulary size."""
    from studio.core.factory import make_tiny_model

    tiny = Path(tempfile.mkdtemp(prefix="tok-")) / "m"
    make_tiny_model(tiny, arch, hidden=256, layers=1, outliers=False)
    folder.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("generation_config.json", "added_tokens.json"):
            shutil.copy(f, folder / f.name)
    cfg = json.loads((tiny / "config.json").read_text())
    shutil.rmtree(tiny.parent, ignore_errors=True)
    return cfg, int(cfg["vocab_size"])


def _attention(
    p: str, hidden: int, heads: int, kv_heads: int, head_dim: int
) -> list[tuple[str, tuple[int, ...]]]:
    return [
        (p + "input_layernorm.weight", (hidden,)),
        (p + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
        (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
        (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
        (p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
        (p + "post_attention_layernorm.weight", (hidden,)),
    ]


def _save(folder: Path, cfg: dict, shapes: list[tuple[str, tuple[int, ...]]], vocab: int, hidden: int) -> int:
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    shapes = [("model.embed_tokens.weight", (vocab, hidden)), *shapes]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return _write_safetensors(folder, shapes)


def write_big_llama(
    folder: Path, *, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int
) -> int:
    """A random float32 Llama checkpoint with a real tokenizer; returns the weight bytes."""
    cfg, vocab = _tokenizer_and_config(folder, "llama")
    head_dim = hidden // heads
    cfg.update(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        dtype="float32",
    )
    shapes: list[tuple[str, tuple[int, ...]]] = []
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += _attention(p, hidden, heads, kv_heads, head_dim) + [
            (p + "mlp.gate_proj.weight", (intermediate, hidden)),
            (p + "mlp.up_proj.weight", (intermediate, hidden)),
            (p + "mlp.down_proj.weight", (hidden, intermediate)),
        ]
    return _save(folder, cfg, shapes, vocab, hidden)


def write_big_moe(folder: Path, *, hidden: int, layers: int, experts: int, expert_ff: int) -> tuple[int, int]:
    """A random float32 Qwen3-MoE checkpoint with a real tokenizer; returns (weight bytes, bytes of
    one merged expert tensor in float32)."""
    cfg, vocab = _tokenizer_and_config(folder, "qwen3_moe")
    heads, kv_heads, head_dim = 8, 4, hidden // 8
    cfg.update(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_local_experts=experts,
        moe_intermediate_size=expert_ff,
        dtype="float32",
    )
    shapes: list[tuple[str, tuple[int, ...]]] = []
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += _attention(p, hidden, heads, kv_heads, head_dim) + [
            (p + "self_attn.q_norm.weight", (head_dim,)),
            (p + "self_attn.k_norm.weight", (head_dim,)),
            (p + "mlp.gate.weight", (experts, hidden)),
        ]
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            shapes += [
                (q + "gate_proj.weight", (expert_ff, hidden)),
                (q + "up_proj.weight", (expert_ff, hidden)),
                (q + "down_proj.weight", (hidden, expert_ff)),
            ]
    return _save(folder, cfg, shapes, vocab, hidden), 4 * experts * expert_ff * hidden


def _write_safetensors(folder: Path, shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape in shapes:
        n = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * ((-len(hb)) % 8)
    rng = np.random.default_rng(0)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for _name, shape in shapes:
            rows = shape[0]
            cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            step = max(1, (8 << 20) // (4 * cols))
            for a in range(0, rows, step):
                b = min(rows, a + step)
                if len(shape) == 1:
                    block = np.ones(b - a, dtype=np.float32)
                else:
                    block = (rng.standard_normal((b - a, cols), dtype=np.float32) * 0.02).astype(np.float32)
                f.write(block.tobytes())
    return off


_PEAK = """
def _peak_mb():
    # VmHWM is this process image's own peak; ru_maxrss on Linux also keeps the forking parent's peak
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def _rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
"""

_EXPORT = (
    _PEAK
    + """
import sys, time, json
t = time.perf_counter()
from studio.core.export.run import export_gguf
r = export_gguf(sys.argv[1], sys.argv[2], sys.argv[3], backend=sys.argv[4])
print(json.dumps({"seconds": time.perf_counter() - t, "peak_rss_mb": _peak_mb(), "file_bytes": r.file_bytes}))
"""
)

_REFERENCE = (
    _PEAK
    + """
import ctypes, sys, time, json, os
import llama_cpp
from llama_cpp import _logger
_logger.set_verbose(False)
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = 15
p.nthread = int(sys.argv[3])
t = time.perf_counter()
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p))
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t, "peak_rss_mb": _peak_mb()}))
"""
)


_EXPORT_MOE = (
    _PEAK
    + """
import sys, time, json
from studio.core.export.run import export_gguf
from studio.core.gguf.arch import layout
from studio.core.model import open_model
with open_model(sys.argv[1]) as ck:
    layout(ck.info)  # loads torch, transformers and the converter: the constant part
import numpy as np
from studio.core.quant.blocks import quantize
for q in ("Q4_K", "Q6_K", "Q8_0", "Q5_0"):  # and the quantizer kernels (numba)
    quantize(np.ones((4, 256), np.float32), q)
base = _rss_mb()
t = time.perf_counter()
r = export_gguf(sys.argv[1], sys.argv[2], sys.argv[3])
print(json.dumps({"seconds": time.perf_counter() - t, "baseline_mb": base, "peak_rss_mb": _peak_mb(),
                  "file_bytes": r.file_bytes}))
"""
)

_CONVERTER_OWN = (
    _PEAK
    + """
import sys, time, json
from pathlib import Path
from studio.core.gguf.arch import layout
from studio.core.gguf.llama_converter import reference_convert
from studio.core.model import open_model
with open_model(sys.argv[1]) as ck:
    info = ck.info
layout(info)
base = _rss_mb()
t = time.perf_counter()
reference_convert(info, Path(sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - t, "baseline_mb": base, "peak_rss_mb": _peak_mb()}))
"""
)


def _run(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if out.returncode != 0:
        raise SystemExit(f"subprocess failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--preset", default="Q4_K_M")
    ap.add_argument("--skip-reference", action="store_true", help="do not run llama.cpp's quantizer")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--moe", action="store_true", help="a mixture-of-experts checkpoint (see the docstring)")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--expert-ff", type=int, default=512)
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="qs-export-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if args.moe:
        try:
            _bench_moe(args, work, model)
        finally:
            if not args.keep and args.dir is None:
                shutil.rmtree(work, ignore_errors=True)
        return
    try:
        t = time.perf_counter()
        if not (model / "model.safetensors").exists():
            wbytes = write_big_llama(
                model,
                hidden=args.hidden,
                layers=args.layers,
                intermediate=args.intermediate,
                heads=16,
                kv_heads=8,
            )
        else:
            wbytes = (model / "model.safetensors").stat().st_size
        print(
            f"model: {wbytes / 1e9:.2f} GB of float32 weights ({time.perf_counter() - t:.0f} s to generate)"
        )
        ours = _run(_EXPORT, str(model), str(work / "ours.gguf"), args.preset, "studio")
        print(
            f"studio export {args.preset}: {ours['seconds']:.1f} s, peak RSS {ours['peak_rss_mb']:.0f} MB "
            f"({ours['peak_rss_mb'] * 1e6 / wbytes * 100:.1f}% of the weights), file {ours['file_bytes'] / 1e6:.0f} MB"
        )
        print("PASS" if ours["peak_rss_mb"] < 600 else "FAIL", "peak RSS < 600 MB")
        if not args.skip_reference:
            f32 = _run(_EXPORT, str(model), str(work / "f32.gguf"), "F32", "studio")
            print(f"studio export F32: {f32['seconds']:.1f} s, peak RSS {f32['peak_rss_mb']:.0f} MB")
            threads = str(os.cpu_count() or 1)
            ref = _run(_REFERENCE, str(work / "f32.gguf"), str(work / "ref.gguf"), threads)
            print(
                f"llama.cpp llama_model_quantize {args.preset} ({threads} threads) on the F32 GGUF: "
                f"{ref['seconds']:.1f} s, peak RSS {ref['peak_rss_mb']:.0f} MB"
            )
            print(
                f"ratio studio/llama.cpp: time {ours['seconds'] / ref['seconds']:.2f}×, "
                f"peak RSS {ours['peak_rss_mb'] / ref['peak_rss_mb']:.2f}×"
            )
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _bench_moe(args: argparse.Namespace, work: Path, model: Path) -> None:
    t = time.perf_counter()
    hidden = args.hidden if args.hidden != 2048 else 1024
    layers = args.layers if args.layers != 8 else 4
    wbytes, merged = write_big_moe(
        model, hidden=hidden, layers=layers, experts=args.experts, expert_ff=args.expert_ff
    )
    print(
        f"MoE model: {wbytes / 1e9:.2f} GB of float32 weights, {layers} layers x {args.experts} experts; "
        f"one merged expert tensor {merged / 2**20:.0f} MiB ({time.perf_counter() - t:.0f} s to generate)"
    )
    ours = _run(_EXPORT_MOE, str(model), str(work / "ours.gguf"), args.preset)
    grow = ours["peak_rss_mb"] - ours["baseline_mb"]
    print(
        f"studio export {args.preset} through llama.cpp's converter: {ours['seconds']:.1f} s, "
        f"RSS {ours['baseline_mb']:.0f} MB before, peak {ours['peak_rss_mb']:.0f} MB: growth {grow:.0f} MB = "
        f"{grow * 2**20 / merged:.2f} x one merged expert tensor"
    )
    print(
        "PASS" if grow * 2**20 <= merged + (64 << 20) else "FAIL",
        "growth <= one merged expert tensor + 64 MiB",
    )
    if not args.skip_reference:
        ref = _run(_CONVERTER_OWN, str(model), str(work / "converter-f32.gguf"))
        rgrow = ref["peak_rss_mb"] - ref["baseline_mb"]
        print(
            f"llama.cpp's converter, its own F32 writer: {ref['seconds']:.1f} s, growth {rgrow:.0f} MB = "
            f"{rgrow * 2**20 / merged:.2f} x one merged expert tensor"
        )
        print(f"ratio studio/converter: peak growth {grow / rgrow:.2f}x")


if __name__ == "__main__":
    main()
