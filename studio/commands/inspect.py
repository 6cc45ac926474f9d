"""``quant-studio-cli inspect MODEL``: what a checkpoint holds and what each preset would need."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from studio.commands._common import print_json
from studio.core.errors import StudioError
from studio.core.gguf.layout import export_route
from studio.core.hardware import detect
from studio.core.model import open_model
from studio.core.model.gguf_source import source_summary
from studio.core.plan.estimate import estimate_presets
from studio.core.units import format_memory


def report(model: str, ctx_len: int = 4096, allow_pickle: bool = False) -> dict[str, Any]:
    """The inspect report as a JSON-ready dict (what ``--json`` prints)."""
    if ctx_len <= 0:
        raise StudioError(f"--ctx must be a positive number of tokens, not {ctx_len}.")
    with open_model(model, allow_pickle=allow_pickle) as ck:
        info = ck.info
        stored = _stored_as(ck)

    hw = detect(probe_torch=False)
    via, why = export_route(info) if info.format.value != "gguf" else (None, None)
    estimates = estimate_presets(info, hw, ctx_len)
    roles = Counter(t.role.value for t in info.tensors)
    first = estimates[0] if estimates else None
    return {
        "path": str(info.path),
        "format": info.format.value,
        "architecture": info.architecture,
        "model_type": info.model_type,
        "layers": info.n_layers,
        "parameters": info.parameters,
        "weight_bytes": info.weight_bytes,
        "files": sorted({str(t.file) for t in info.tensors}),
        "roles": dict(sorted(roles.items())),
        "layer_roles": _layer_roles(info),
        "export": {"via": via, "error": why},
        "experts": (
            {"per_layer": first.n_experts, "used": first.n_experts_used}
            if first is not None and first.n_experts
            else None
        ),
        "active_parameters": first.n_active_params if first is not None else None,
        "tensors": [
            {
                "name": t.name,
                "shape": list(t.shape),
                "dtype": t.dtype,
                "role": t.role.value,
                "layer": t.layer,
                "bytes": t.nbytes,
                "transposed": t.transposed,
            }
            for t in info.tensors
        ],
        "warnings": list(info.warnings),
        "stored_as": stored,
        "hardware": {
            "cpu": hw.cpu_name,
            "cpu_cores": hw.cpu_cores,
            "ram_total_bytes": hw.ram_total_bytes,
            "ram_available_bytes": hw.ram_available_bytes,
            "gpus": [
                {
                    "name": g.name,
                    "backend": g.backend.value,
                    "total_bytes": g.total_bytes,
                    "free_bytes": g.free_bytes,
                    "unified": g.unified,
                }
                for g in hw.gpus
            ],
        },
        "ctx": ctx_len,
        "estimates": [
            {
                "preset": e.preset,
                "file_bytes": e.file_bytes,
                "tensor_bytes": e.tensor_bytes,
                "memory_bytes": e.memory_bytes,
                "kv_bytes": e.kv_bytes,
                "overhead_bytes": e.overhead_bytes,
                "bits_per_weight": round(e.bits_per_weight, 3),
                "verdict": e.verdict.value,
                "gpu_layers": e.gpu_layers,
                "fallbacks": e.n_fallbacks,
                "exact": e.exact,
                "parameters": e.n_params,
                "active_parameters": e.n_active_params,
            }
            for e in estimates
        ],
    }


def _layer_roles(info: Any) -> dict[str, int]:
    """Role → tensors in the first layer (what every block of the model holds)."""
    layers = sorted({t.layer for t in info.tensors if t.layer is not None})
    if not layers:
        return {}
    return dict(Counter(t.role.value for t in info.tensors if t.layer == layers[0]))


_VIA = {"studio": "Quant Studio's own mapping", "llama.cpp": "llama.cpp's converter"}


def _stored_as(ck: Any) -> dict[str, Any] | None:
    """For a GGUF: its types and bits per weight, and the requantization warning (None otherwise)."""
    g = getattr(ck, "gguf", None)
    if g is None:
        return None

    return source_summary(g).to_dict()


def format_text(r: dict[str, Any]) -> str:
    """The report as readable text."""
    lines = [
        f"Model:        {r['path']} ({r['format']}, {len(r['files'])} file{'s' if len(r['files']) != 1 else ''})",
        f"Architecture: {r['architecture']} (model_type {r['model_type']}), {r['layers']} layers",
        f"Parameters:   {r['parameters']:,} ({format_memory(r['weight_bytes'])} stored)",
        f"Tensors:      {len(r['tensors'])}",
    ]
    for role, n in sorted(r["roles"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {role:<16}{n:>6}")
    if r.get("layer_roles"):
        per = ", ".join(f"{k}{f' x{n}' if n > 1 else ''}" for k, n in r["layer_roles"].items())
        lines.append(f"Each layer:   {per}")
    if r.get("experts"):
        x = r["experts"]
        lines.append(
            f"Experts:      {x['per_layer']} per layer, {x['used']} used per token; "
            f"{r['active_parameters']:,} of {r['estimates'][0]['parameters']:,} weights active per token"
        )
    ex = r.get("export") or {}
    if ex.get("via"):
        lines.append(f"GGUF export:  by {_VIA.get(ex['via'], ex['via'])}")
    elif ex.get("error"):
        lines.append(f"GGUF export:  {ex['error']}")
    stored = r.get("stored_as")
    if stored:
        types = ", ".join(
            f"{k}×{v}" for k, v in sorted(stored["types"].items(), key=lambda kv: -stored["weights"][kv[0]])
        )
        lines.append(f"Stored as:    {types} ({stored['bpw']:.2f} bits per weight)")
        if stored["warning"]:
            lines.append(f"  note: {stored['warning']}")
    if r["warnings"]:
        lines.append("Warnings:")
        lines += [f"  - {w}" for w in r["warnings"]]
    hw = r["hardware"]
    gpus = ", ".join(f"{g['name']} {format_memory(g['free_bytes'])} free" for g in hw["gpus"]) or "none"
    lines.append(
        f"Hardware:     GPU {gpus}; RAM {format_memory(hw['ram_available_bytes'])} free of {format_memory(hw['ram_total_bytes'])}"
    )
    lines.append(f"Estimates (context {r['ctx']} tokens; memory = weights + KV cache + overhead):")
    lines.append(f"  {'preset':<8}{'file':>12}{'memory':>12}{'bpw':>7}  verdict")
    for e in r["estimates"]:
        note = "" if e["exact"] else "  (approximate)"
        lines.append(
            f"  {e['preset']:<8}{format_memory(e['file_bytes']):>12}{format_memory(e['memory_bytes']):>12}"
            f"{e['bits_per_weight']:>7.2f}  {e['verdict']}{note}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Handler of ``inspect``."""
    r = report(args.model, args.ctx, args.allow_pickle)
    if args.json:
        print_json(r, indent=None)
    else:
        print(format_text(r))
    return 0
