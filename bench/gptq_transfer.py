"""How far GPTQ's gain carries from the calibration text to other text: a minute-scale proxy for ``llama-perplexity
--kl-divergence`` on held-out text, per GPTQ option.

The studio's GPTQ minimises a layer's output error under its calibration Hessian H = E[x xᵀ]. What the user
gets is the error under the Hessian of the text they run. This script collects, for a few layers of a real
model (transformers, float32; q_proj, o_proj and gate_proj inputs, optionally down_proj), H of the export's own
calibration chunks (the user's text followed by the built-in mix, as ``export --method gptq`` cuts them) and of
each judged text, then rounds each weight with llama.cpp's imatrix search and with GPTQ under each option set,
and prints every judged text's error (the sum over the sites) as a ratio to the imatrix search's, measured in
the same run. Judged texts:

* ``rest``: the calibration text's chunks that the export does not read (held out, the same kind of text);
* each ``--judge FILE[:N]`` (default: ``resources/eval/code_python.txt``, another kind: Python);
* ``--oracle`` adds GPTQ fitted to each judged text itself (the bound no calibration text can beat);
* ``--rotate SEED`` adds the imatrix search and GPTQ on the sites rotated as ``export --rotate`` writes them
  (issue 41's R1, the norm's scale folded in; o_proj's per-head R2 is not applied), against the same
  unrotated imatrix search.

    python bench/gptq_transfer.py --model BENCH --calib-text LICENCES.txt [--layers 2,14,26] [--qtype Q3_K]
        [--gptq damp=3.0] [--gptq damp=0.01,damp_mode=mean] [--judge FILE[:N]] [--oracle] [--down] [--rotate SEED]

Not part of the test suite: collecting the Hessians of the 1.5B bench model takes about 8 min on two cores
(one forward pass per chunk up to the last layer asked for), each option set about 30 s at Q3_K and several
minutes at the lattice i-quants (IQ2_S, layers 2 and 14: about 9 min at nice 10 beside an export).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import peak_mib  # noqa: E402
from gptq_quality import _parse_opts  # noqa: E402

SITES = ("q_proj", "o_proj", "gate_proj")
DEFAULT_JUDGE = ROOT / "resources" / "eval" / "code_python.txt"


def _model_dir(model: str) -> Path:
    """The Hugging Face folder of ``model`` (BENCH: the bench model's converted folder, made once)."""
    from studio.core.benchmodel import BENCH_ALIAS, bench_model_path
    from studio.core.model.gguf_source import hf_folder_for

    if model == BENCH_ALIAS:
        return hf_folder_for(bench_model_path())
    p = Path(model).expanduser()
    return hf_folder_for(p) if p.suffix.lower() == ".gguf" else p


def _chunks(folder: Path, source, n: int, skip: int = 0):  # noqa: ANN001 - a path or a list of them
    """Token chunks of ``source`` as the export cuts them: chunks [skip, skip + n), fewer if the text is short."""
    from studio.core.calib.calibrate import prepare_input

    ci = prepare_input(folder, source, n_ctx=512)
    return ci.chunks.tokens[skip : skip + n]


def collect(folder: Path, layers: list[int], texts: dict[str, object], down: bool) -> dict:
    """{(text, site): mean x xᵀ (float64)} and {site: weight} for the layers' sites, one forward per chunk."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, low_cpu_mem_usage=True).eval()
    names = (*SITES, "down_proj") if down else SITES
    mods = {}
    for li in layers:
        lay = m.model.layers[li]
        for nm in names:
            mods[f"{li}.{nm}"] = getattr(lay.mlp if nm in ("gate_proj", "down_proj") else lay.self_attn, nm)
    sums: dict = {}
    now = [""]

    def hook(site: str):  # noqa: ANN202
        def f(_mod, inp) -> None:  # noqa: ANN001
            x = inp[0].reshape(-1, inp[0].shape[-1]).double()
            s, k = sums.get((now[0], site), (0, 0))
            sums[(now[0], site)] = (s + x.T @ x, k + x.shape[0])

        return f

    for site, mod in mods.items():
        mod.register_forward_pre_hook(hook(site))
    m.model.layers = m.model.layers[: max(layers) + 1]  # nothing after the last layer asked for is needed
    m.model.norm = torch.nn.Identity()
    m.lm_head = torch.nn.Identity()
    with torch.no_grad():
        for name, chunks in texts.items():
            now[0] = name
            for ids in chunks:
                m.model(input_ids=torch.as_tensor(ids).view(1, -1))
    hess = {key: s / k for key, (s, k) in sums.items()}
    weights = {site: mod.weight.detach().float().clone() for site, mod in mods.items()}
    norms = {}  # γ of the norm a reader of the residual stream reads through; None: a writer into it
    for site in mods:
        li, nm = site.split(".")
        lay = m.model.layers[int(li)]
        norm = {"q_proj": lay.input_layernorm, "gate_proj": lay.post_attention_layernorm}.get(nm)
        norms[site] = None if norm is None else norm.weight.detach().double().clone()
    return {"hess": hess, "weights": weights, "norms": norms}


def rotated(data: dict, seed: int) -> dict:
    """The sites as ``--rotate`` writes them (R1, the residual stream's randomised Hadamard rotation Q, the
    norm's scale γ folded in): a reader's W·diag(γ)·Q under Qᵀ·diag(1/γ)·H·diag(1/γ)·Q, a writer's Qᵀ·W under
    the same H. An orthogonal Q keeps every output error comparable with the unrotated one's."""
    import torch

    from studio.core.model.rotate import rotation_matrix

    qs: dict[int, object] = {}
    out = {"hess": {}, "weights": {}, "norms": data["norms"]}
    for site, w in data["weights"].items():
        gamma = data["norms"][site]
        n = int(w.shape[1] if gamma is not None else w.shape[0])
        q = qs.setdefault(n, torch.as_tensor(rotation_matrix(n, seed)).double())
        if gamma is None:  # a writer into the stream: its rows turn
            out["weights"][site] = (q.T @ w.double()).float()
        else:
            out["weights"][site] = ((w.double() * gamma) @ q).float()
        for (text, s), h in data["hess"].items():
            if s == site:
                out["hess"][(text, s)] = (
                    h if gamma is None else q.T @ (h / gamma[:, None] / gamma[None, :]) @ q
                )
    return out


def ratios(data: dict, judged: list[str], qtype: str, options, fit: str = "cal", turned: dict | None = None):  # noqa: ANN001, ANN201
    """Each judged text's summed output error of GPTQ (fitted to ``fit``'s Hessian; ``options`` None: the
    imatrix search) over llama.cpp's imatrix search's (the calibration's imatrix, as llama.cpp's file would
    have it) on the unrotated weights; ``turned``: round ``rotated(data)``'s weights instead."""
    import torch

    from studio.core.quant import blocks
    from studio.core.quant.gptq import gptq_quantize, output_error
    from studio.core.quant.gptq_lattice import gptq_lattice
    from studio.core.quant.iquants import IQ_TYPES

    sweep = gptq_lattice if qtype in IQ_TYPES else gptq_quantize
    base = dict.fromkeys(judged, 0.0)
    got = dict.fromkeys(judged, 0.0)
    src = turned or data

    def search(w, h):  # noqa: ANN001, ANN202 - llama.cpp's imatrix-weighted search, any type (i-quants too)
        imx = torch.diagonal(h).float().numpy().copy()
        packed = blocks.quantize(w.numpy(), qtype, imx)
        return torch.from_numpy(blocks.dequantize(packed, qtype, tuple(w.shape))).float()

    made = data.setdefault("baseline", {})  # the unrotated search's values, made once per site for every row
    for site, w in data["weights"].items():
        if site not in made:
            made[site] = search(w, data["hess"][("cal", site)])
        q0 = made[site]
        wq, hf = src["weights"][site], src["hess"][(fit, site)]
        if options is None:
            q = search(wq, hf)
        else:
            r = sweep(
                wq, hf.float(), qtype, imatrix=torch.diagonal(hf).float().numpy().copy(), options=options
            )
            q = torch.from_numpy(blocks.dequantize(r.data, qtype, tuple(wq.shape))).float()
        for j in judged:
            base[j] += output_error(w, q0, data["hess"][(j, site)])
            got[j] += output_error(wq, q, src["hess"][(j, site)])
    return {j: got[j] / base[j] for j in judged}


def main() -> None:
    """Collect, round, print the table (and ``--json``)."""
    from studio.core.calib.data import calibration_sources
    from studio.core.quant.gptq import GptqOptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="BENCH")
    ap.add_argument("--calib-text", required=True, help="the user's calibration text (as export's)")
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--calib-only", action="store_true", help="the text alone, without the built-in mix")
    ap.add_argument("--judge", action="append", default=[], help="FILE[:N] of another kind (N chunks, 8)")
    ap.add_argument("--layers", default="2,14,26")
    ap.add_argument("--qtype", default="Q3_K")
    ap.add_argument("--gptq", action="append", default=[], help="GptqOptions as k=v,... (repeat)")
    ap.add_argument("--oracle", action="store_true", help="also GPTQ fitted to each judged text itself")
    ap.add_argument("--down", action="store_true", help="down_proj too (8960-wide Hessians on the 1.5B)")
    ap.add_argument(
        "--rotate", type=int, metavar="SEED", help="also the sites rotated as --rotate writes them (R1)"
    )
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    folder = _model_dir(a.model)
    src = a.calib_text if a.calib_only else calibration_sources(a.calib_text, "gptq")
    texts: dict[str, object] = {
        "cal": _chunks(folder, src, a.calib_chunks),
        "rest": _chunks(folder, a.calib_text, 8, skip=a.calib_chunks),
    }
    for spec in a.judge or [str(DEFAULT_JUDGE)]:
        path, _, n = spec.partition(":")
        texts[Path(path).stem] = _chunks(folder, path, int(n or 8))
    judged = [k for k in texts if k != "cal" and len(texts[k])]
    data = collect(folder, [int(x) for x in a.layers.split(",")], texts, a.down)
    t1 = time.perf_counter()
    sets = a.gptq or ["damp=3.0,damp_mode=diag", "damp=0.01,damp_mode=mean"]
    rows = []
    print(
        f"{a.qtype}, layers {a.layers}: GPTQ's output error / llama.cpp's imatrix search's (lower is better)"
    )
    print(f"{'GPTQ options':34s} {'fitted to':9s} " + " ".join(f"{j:>12s}" for j in ["cal", *judged]))
    fits = [("cal", s, None) for s in sets] + ([(j, sets[0], None) for j in judged] if a.oracle else [])
    if a.rotate is not None:
        turned = rotated(data, a.rotate)
        fits += [("cal", "imatrix search", turned), ("cal", sets[0], turned)]
    for fit, spec, turn in fits:
        opt = None if spec == "imatrix search" else GptqOptions(**_parse_opts(spec))
        r = ratios(data, ["cal", *judged], a.qtype, opt, fit, turn)
        label = f"{spec} (rotated)" if turn is not None else spec
        rows.append({"options": label, "fitted_to": fit, **r})
        print(f"{label:34s} {fit:9s} " + " ".join(f"{r[j]:12.3f}" for j in ["cal", *judged]), flush=True)
    tokens = {k: int(len(v)) * 512 for k, v in texts.items()}
    print(
        f"tokens {tokens}; collect {t1 - t0:.0f} s, round {time.perf_counter() - t1:.0f} s, peak RSS {peak_mib():.0f} MiB"
    )
    if a.json:
        a.json.write_text(
            json.dumps({"qtype": a.qtype, "layers": a.layers, "tokens": tokens, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
