"""Rotation (``export --rotate``) vs none on factory models, the same per-tensor types (token_embd kept at
the unrotated file's type when the rotation unties the head): mean KLD against the F16 file in
llama.cpp over 256 tokens of the factory's sample text, with and without the factory's planted outliers.

    python bench/rotation_factory.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studio.core.export.run import export_gguf  # noqa: E402
from studio.core.factory import make_tiny_model, sample_text  # noqa: E402
from studio.core.gguf.read import read_gguf  # noqa: E402
from studio.core.llamacpp import LlamaRunner, LoadOptions  # noqa: E402
from studio.core.model import open_model  # noqa: E402
from studio.core.model.rotate import RotatedCheckpoint, Rotation  # noqa: E402
from studio.core.plan.plan import Override, plan_from_preset, with_overrides  # noqa: E402


def kld(p: np.ndarray, q: np.ndarray) -> float:
    """Mean KL(P‖Q) of two logit arrays over positions."""

    def ls(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = ls(p), ls(q)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def main() -> int:
    from transformers import AutoTokenizer

    root = Path(tempfile.mkdtemp())
    for arch, outl in (("qwen2", True), ("qwen2", False), ("llama", False)):
        m = make_tiny_model(root / f"{arch}{outl}", arch, hidden=512, layers=4, outliers=outl)
        ids = AutoTokenizer.from_pretrained(m)(sample_text()[:3000])["input_ids"][:256]
        files = {"f16": root / f"{arch}{outl}-f16.gguf"}
        export_gguf(m, files["f16"], "F16")
        for preset in ("Q4_0", "Q3_K_M"):
            f = root / f"{arch}{outl}-{preset}.gguf"
            export_gguf(m, f, preset)
            files[preset] = f
            emb = {t.name: t.type_name for t in read_gguf(f).tensors}["token_embd.weight"]
            with open_model(m) as ck:
                info = RotatedCheckpoint(ck, Rotation()).info
                plan = with_overrides(plan_from_preset(info, preset), info, [Override(r"embed_tokens", emb)])
            f = root / f"{arch}{outl}-{preset}-rot.gguf"
            export_gguf(m, f, plan, rotation=Rotation())
            files[preset + " rotated"] = f
        with LlamaRunner(label="bench") as w:
            lg = {}
            for k, f in files.items():
                w.load(f, LoadOptions(logits_all=True, n_ctx=512, f32_kv=True))
                lg[k] = w.request("eval_logits", ids=ids)
        kl = {k: kld(lg["f16"], lg[k]) for k in lg if k != "f16"}
        print(
            f"{arch} ({'planted outliers' if outl else 'no outliers'}): "
            + ", ".join(f"{k} {v:.4f}" for k, v in kl.items())
        )
        for preset in ("Q4_0", "Q3_K_M"):
            print(f"  {preset}: rotated / unrotated = {kl[preset + ' rotated'] / kl[preset]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
