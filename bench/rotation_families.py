"""``export --rotate`` on every family the studio exports (factory models): the rotated file computes the
unrotated one's function in llama.cpp (mean KLD of the logits over the factory's sample text), and what
rotating costs the export (wall ratio, rotated ÷ plain, measured in the same run; peak RSS of this process).

R1 and R2 where R1 folds, R2 alone on Gemma 1–3, OLMo 2 (post-norms) and BERT (skipped here: it embeds, and
tests/core/export/test_rotated_export.py compares its hidden states). MoE files are compared in F16 and F32:
in F16 a router's near-tie can flip between two experts on a token.

    python bench/rotation_families.py [ARCH ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import peak_mib  # noqa: E402
from rotation_factory import kld  # noqa: E402

from studio.core.export.run import export_gguf  # noqa: E402
from studio.core.factory import make_tiny_model, sample_text  # noqa: E402
from studio.core.gguf.read import read_gguf  # noqa: E402
from studio.core.llamacpp import LlamaRunner, LoadOptions  # noqa: E402
from studio.core.model.rotate import Rotation  # noqa: E402

FAMILIES = (
    *("llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "gemma", "gemma2"),
    *("gemma3_text", "olmo2", "mixtral", "qwen3_moe", "granite", "smollm3"),
)
MOE = ("mixtral", "qwen3_moe")


def _timed_export(model: Path, out: Path, ftype: str, rotation: Rotation | None) -> float:
    t0 = time.perf_counter()
    export_gguf(model, out, ftype, rotation=rotation)
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    from transformers import AutoTokenizer

    root = Path(tempfile.mkdtemp(prefix="qs-rotation-families-"))
    with LlamaRunner(label="bench") as w:
        for arch in argv or FAMILIES:
            m = make_tiny_model(root / arch, arch)
            ids = AutoTokenizer.from_pretrained(m)(sample_text()[:3000])["input_ids"][:200]
            for ftype in ("F16", "F32") if arch in MOE else ("F16",):
                plain, rot = root / f"{arch}-{ftype}.gguf", root / f"{arch}-{ftype}-rot.gguf"
                t_plain = _timed_export(m, plain, ftype, None)
                t_rot = _timed_export(m, rot, ftype, Rotation(seed=0))
                r1 = read_gguf(rot).metadata["quantize.rotation.r1"]
                logits = []
                for f in (plain, rot):
                    w.load(f, LoadOptions(logits_all=True, n_ctx=512, f32_kv=True))
                    logits.append(w.request("eval_logits", ids=ids))
                top = float((logits[0].argmax(-1) == logits[1].argmax(-1)).mean())
                print(
                    f"{arch} {ftype} ({'R1+R2' if r1 else 'R2 alone'}): KLD {kld(*logits):.1e} over {len(ids)} "
                    f"tokens, top token {top:.1%} the same, {plain.stat().st_size:,} → {rot.stat().st_size:,} "
                    f"bytes, export {t_plain:.2f} s → {t_rot:.2f} s ({t_rot / t_plain:.1f}×)",
                    flush=True,
                )
    print(f"peak RSS of this process: {peak_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
