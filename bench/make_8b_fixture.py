"""Write an 8B-shaped checkpoint (Llama-3.1-8B's shapes, random BF16 weights, three shards, an index,
a tokenizer llama.cpp's converter recognises) for the scale bench and by-hand trials.

Usage: ``python bench/make_8b_fixture.py OUT [--layers N] [--vocab V] [--shard-gb 6]``
(``--layers 2`` keeps the widths and writes ~3 GB; the full one is 16.1 GB.)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from studio.core.factory.big import LLAMA_8B, write_big_llama  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=LLAMA_8B.layers)
    ap.add_argument("--vocab", type=int, default=LLAMA_8B.vocab)
    ap.add_argument("--shard-gb", type=float, default=6.0)
    a = ap.parse_args()
    shape = dataclasses.replace(LLAMA_8B, layers=a.layers, vocab=a.vocab)
    t0 = time.perf_counter()
    path = write_big_llama(a.out, shape, shard_bytes=int(a.shard_gb * 1e9))
    print(f"{path}: {shape.bytes() / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
