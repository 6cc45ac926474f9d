"""Peak memory a piece of code adds, measured in a child process (its ``ru_maxrss`` before and after): the
memory tests' one way to run a probe script, which prints ``{"added": bytes}`` as its last line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def added_peak(script: str, *args: str, threads: int = 1, timeout: int = 600) -> int:
    """Run ``script`` (given the repository root and ``args``) in a fresh interpreter with ``threads``
    OpenMP threads; the bytes its last line reports as added to the peak."""
    out = subprocess.run(
        [sys.executable, "-c", script, str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(json.loads(out.stdout.strip().splitlines()[-1])["added"])


_HEAD = """
import json, resource, sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[1])
g = torch.Generator().manual_seed(0)
def weight_and_hessian(rows, n, rank):
    w = torch.randn(rows, n, generator=g) * 0.02
    a = torch.randn(n, rank, generator=g)
    return w, a @ a.T / rank
"""

_TAIL = """
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
{call}
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"added": after - before}}))
"""


def added_by(setup: str, call: str, *, threads: int = 1) -> int:
    """``added_peak`` of the statement ``call`` after ``setup`` (which may use ``np``, ``torch``, the
    seeded generator ``g`` and ``weight_and_hessian(rows, n, rank)``: a random weight and a rank-``rank``
    Hessian of its inputs)."""
    return added_peak(_HEAD + setup + _TAIL.format(call=call), threads=threads)
