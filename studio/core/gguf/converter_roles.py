"""What llama.cpp's converter names and knows: the role and layer of a GGUF tensor name, the
architectures it converts, and the error for one it does not."""

from __future__ import annotations

import functools
import re

from studio.core.errors import ExportError
from studio.core.gguf.converter_bundle import (
    converter_available,
    known_architectures,
    load_bundle_gguf,
    load_converter,
)
from studio.core.modelinfo import ModelInfo, Role

_LAYER = re.compile(r"^blk\.(\d+)\.")

# GGUF tensor name → role (llama.cpp's naming; expert tensors are the merged 3-D ones).
_GGUF_ROLES: tuple[tuple[re.Pattern[str], Role], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"^(?:per_layer_)?token_embd\.", Role.TOKEN_EMBD),
        (r"^(?:position_embd|pos_embd)\.", Role.POS_EMBD),
        (r"^token_types\.", Role.TYPE_EMBD),
        (r"norm(?:_\w+)?\.(?:weight|bias)$", Role.NORM),
        (r"^output\.", Role.OUTPUT),
        (r"\.ffn_gate_inp(?:_shexp)?\.", Role.FFN_ROUTER),
        (r"\.ffn_gate_up_exps\.", Role.FFN_GATE_UP_EXPS),
        (r"\.ffn_gate_exps\.", Role.FFN_GATE_EXPS),
        (r"\.ffn_up_exps\.", Role.FFN_UP_EXPS),
        (r"\.ffn_down_exps\.", Role.FFN_DOWN_EXPS),
        (r"\.attn_qkv\.", Role.ATTN_QKV),
        (r"\.attn_q\.", Role.ATTN_Q),
        (r"\.attn_k\.", Role.ATTN_K),
        (r"\.attn_v\.", Role.ATTN_V),
        (r"\.attn_output\.", Role.ATTN_OUT),
        (r"\.ffn_gate_up(?:_shexp)?\.", Role.FFN_GATE_UP),
        (r"\.ffn_gate(?:_shexp)?\.", Role.FFN_GATE),
        (r"\.ffn_up(?:_shexp)?\.", Role.FFN_UP),
        (r"\.ffn_down(?:_shexp)?\.", Role.FFN_DOWN),
    )
)


def gguf_role(gguf_name: str) -> Role:
    """The role of a GGUF tensor name as llama.cpp writes it (``OTHER`` when none fits)."""
    return next((r for p, r in _GGUF_ROLES if p.search(gguf_name)), Role.OTHER)


def gguf_layer(gguf_name: str) -> int | None:
    """The block number of a GGUF tensor name (``blk.3.attn_q.weight`` → 3)."""
    m = _LAYER.match(gguf_name)
    return int(m.group(1)) if m else None


# ----------------------------------------------------------------------------------- knowledge


def hf_architecture(info: ModelInfo) -> str:
    """The HF architecture class name the converter dispatches on (config ``architectures[0]``)."""
    archs = info.config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return info.architecture


def converter_knows(info: ModelInfo) -> bool:
    """Whether llama.cpp's converter (when installed) has a text model class for this checkpoint."""
    return hf_architecture(info) in known_architectures()


@functools.lru_cache(maxsize=2)
def role_table(root: str) -> dict[str, Role]:
    """GGUF tensor-name pattern → role, from the tensor map of llama.cpp's converter at ``root``."""
    g = load_bundle_gguf()
    tnm = g.TensorNameMap
    table: dict[str, Role] = {}
    cfgs = [tnm.mappings_cfg, tnm.block_mappings_cfg, *tnm.arch_block_mappings_cfg.values()]
    for cfg in cfgs:
        for tensor, keys in cfg.items():
            gname = g.TENSOR_NAMES.get(tensor)
            if gname is None:
                continue
            role = gguf_role(gname.format(bid=0, xid=0) + ".weight")
            for key in keys:
                k = key.format(bid=0, xid=0) if "{" in key else key
                # the first mapping wins, as in a TensorNameMap built for one architecture
                table.setdefault(_DIGITS.sub(".0.", k), role)
    return table


_DIGITS = re.compile(r"\.\d+\.")


def unknown_architecture_error(info: ModelInfo) -> ExportError:
    """The one sentence for an architecture neither the studio nor the converter converts."""
    arch = hf_architecture(info)
    ok, why = converter_available()
    if ok:
        return ExportError(
            f"Neither Quant Studio nor {load_converter().bundle.label} can convert the architecture "
            f"{arch} (model type {info.model_type!r}) of {info.path} to GGUF."
        )
    why = (why or "llama.cpp's converter is not available.").rstrip(".")
    return ExportError(
        f"Quant Studio does not convert the architecture {arch} (model type {info.model_type!r}) of "
        f"{info.path} to GGUF itself, and {why[0].lower() + why[1:]}."
    )
