"""llama.cpp's references on the 1.5B bench model (issue 38): F16 base logits, an imatrix of the prose and
llama.cpp's presets quantized with it, each as file bytes and KLD on Python source, kept in a folder.

Every artifact and every figure is kept in ``ROOT`` (``refs.json`` holds sizes, KLDs and seconds), so a
second call reuses them: the slow tests and the README's table share one set. Run a piece at a time:

    python -m tests.real._bench_refs ROOT --steps base,imatrix
    python -m tests.real._bench_refs ROOT --steps IQ3_XXS,IQ2_M
    python -m tests.real._bench_refs ROOT --kld FILE.gguf      # one more file against the same base

Recipe (the demo's, tests/real/_llama_refs.py, with the bench model's sizes): base logits from
``llama-quantize --allow-requantize BENCH F16`` (the Q4_K_M file's weights, exactly), ``llama-imatrix`` on
the first ``CALIB_CHUNKS`` chunks of 512 tokens of the licence prose, ``llama-quantize --imatrix`` from the
F16 file, ``llama-perplexity --kl-divergence`` (ctx 512) on ``resources/eval/code_python.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from studio.core.benchmodel import bench_model_path
from tests.real._llama_refs import CALIB_PARTS, EVAL, LICENCES, LLAMA_BIN

PRESETS = ("IQ2_M", "IQ3_XXS", "IQ3_M", "Q3_K_M")
CALIB_CHUNKS = 8  # 4,096 tokens of the 14,691 the prose holds: what two shared cores allow for both sides
THREADS = str(min(2, os.cpu_count() or 1))
_KLD = re.compile(r"Mean\s+KLD:\s+([0-9.eE+-]+)\s+±\s+([0-9.eE+-]+)")
_CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks")


def missing(cache_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Why the references cannot be made here (a sentence), or None; ``cache_dir``: the bench model's cache."""
    for tool in ("llama-perplexity", "llama-imatrix", "llama-quantize"):
        if not (LLAMA_BIN / tool).is_file():
            return f"{tool} is not built at {LLAMA_BIN} (set QS_LLAMA_BIN to a llama.cpp build/bin folder)"
    if not all((LICENCES / p).is_file() for p in CALIB_PARTS):
        return f"the calibration prose ({', '.join(CALIB_PARTS)}) is not in {LICENCES}"
    try:
        bench_model_path(cache_dir)
    except Exception as exc:  # BenchModelError: not fetched
        return str(exc)
    return None


def _run(*cmd: str) -> tuple[str, float]:
    """(stdout + stderr, wall seconds) of a tool that must succeed."""
    t0 = time.perf_counter()
    res = subprocess.run(list(cmd), capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({res.returncode}): {res.stderr.strip()[-400:]}")
    return res.stdout + res.stderr, time.perf_counter() - t0


class Refs:
    """The reference folder and its ``refs.json``."""

    def __init__(self, root: str | os.PathLike[str], model: str | os.PathLike[str] | None = None) -> None:
        self.model = Path(model) if model else bench_model_path()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.json = self.root / "refs.json"
        self.data: dict = json.loads(self.json.read_text()) if self.json.is_file() else {}
        self.calib = self.root / "calib_licences.txt"
        self.f16 = self.root / "bench-F16.gguf"
        self.base = self.root / "base.kld"
        self.imatrix = self.root / "imatrix.gguf"

    def _save(self) -> None:
        tmp = self.json.with_suffix(".partial")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.json)

    def ensure_base(self) -> None:
        """The F16 file and its base logits on the evaluation text."""
        if not self.calib.is_file():
            self.calib.write_bytes(b"".join((LICENCES / p).read_bytes() for p in CALIB_PARTS))
        if "f16" not in self.data:
            _, s = _run(str(LLAMA_BIN / "llama-quantize"), "--allow-requantize", str(self.model),
                        str(self.f16), "F16", THREADS)  # fmt: skip
            self.data["f16"] = {"bytes": self.f16.stat().st_size, "s": round(s, 1)}
            self._save()
        if "base" not in self.data:
            out, s = _run(str(LLAMA_BIN / "llama-perplexity"), "-m", str(self.f16), "-f", str(EVAL), "-c", "512",
                          "--kl-divergence-base", str(self.base), "--no-repack", "-t", THREADS)  # fmt: skip
            m = _CHUNKS.search(out)
            self.data["base"] = {
                "s": round(s, 1),
                "chunks": int(m.group(1)) if m else None,
                "eval": EVAL.name,
            }
            self._save()

    def ensure_imatrix(self) -> None:
        """llama-imatrix of the prose on the F16 file."""
        self.ensure_base()
        if "imatrix" not in self.data:
            _, s = _run(str(LLAMA_BIN / "llama-imatrix"), "-m", str(self.f16), "-f", str(self.calib), "-c", "512",
                        "--chunks", str(CALIB_CHUNKS), "-o", str(self.imatrix), "--no-repack",
                        "-t", THREADS)  # fmt: skip
            self.data["imatrix"] = {"s": round(s, 1), "chunks": CALIB_CHUNKS}
            self._save()

    def kld(self, gguf: Path) -> dict:
        """{"kld", "kld_se", "s"} of ``gguf`` against the base logits."""
        self.ensure_base()
        out, s = _run(str(LLAMA_BIN / "llama-perplexity"), "-m", str(gguf), "-c", "512", "--kl-divergence-base",
                      str(self.base), "--kl-divergence", "--no-repack", "-t", THREADS)  # fmt: skip
        m = _KLD.search(out)
        if m is None:
            raise RuntimeError(f"llama-perplexity printed no mean KLD for {gguf}")
        return {"kld": float(m.group(1)), "kld_se": float(m.group(2)), "s": round(s, 1)}

    def preset(self, preset: str) -> dict:
        """{"bytes", "kld", "kld_se", "quantize_s", "s"} of llama.cpp's ``preset`` with the prose imatrix."""
        got = self.data.setdefault("presets", {}).get(preset)
        if got is None:
            self.ensure_imatrix()
            f = self.root / f"llama-{preset}.gguf"
            _, qs = _run(str(LLAMA_BIN / "llama-quantize"), "--imatrix", str(self.imatrix), str(self.f16), str(f),
                         preset, THREADS)  # fmt: skip
            got = {"bytes": f.stat().st_size, **self.kld(f), "quantize_s": round(qs, 1)}
            self.data["presets"][preset] = got
            self._save()
        return got


def main(argv: list[str] | None = None) -> int:
    """Make the references named by --steps in ROOT (or measure one more file) and print refs.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--steps", default="base,imatrix," + ",".join(PRESETS))
    ap.add_argument("--kld", metavar="FILE.gguf", help="also measure this file against the base logits")
    args = ap.parse_args(argv)
    why = missing()
    if why:
        print(f"cannot make the references: {why}", file=sys.stderr)
        return 1
    refs = Refs(args.root)
    for step in filter(None, args.steps.split(",")):
        {"base": refs.ensure_base, "imatrix": refs.ensure_imatrix}.get(step, lambda s=step: refs.preset(s))()
    if args.kld:
        res = refs.kld(Path(args.kld))
        refs.data.setdefault("studio", {})[Path(args.kld).name] = {
            "bytes": Path(args.kld).stat().st_size,
            **res,
        }
        refs._save()
    print(json.dumps(refs.data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
