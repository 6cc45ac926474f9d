"""GPTQ's memory at wide inputs (issue 40): the inverse factor and the sweep hold a few n × n copies of the
Hessian, not nine (at 8B's 14336-wide ``down_proj`` input each float32 copy is 0.8 GB), and the damping
leaves the caller's Hessian as it came."""

from __future__ import annotations

import pytest

from studio.core.quant import gptq
from studio.core.quant.gptq import HessianError
from tests.memprobe import added_peak

# One process per type: its peak RSS (ru_maxrss) after the Hessian is made, and after GPTQ of a
# 64 × 8192 weight on it (an n × n float32 copy is 268 MB there).
_PROBE = """
import json, resource, sys
import torch
sys.path.insert(0, sys.argv[1])
from studio.core.quant.gptq import gptq_quantize
from studio.core.quant.gptq_lattice import LATTICE_TYPES, gptq_lattice
q, n = sys.argv[2], 8192
g = torch.Generator().manual_seed(0)
w = torch.randn(64, n, generator=g) * 0.02
a = torch.randn(n, 96, generator=g, dtype=torch.float64)
h = a @ a.T
h.diagonal().add_(1.0)
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
(gptq_lattice if q in LATTICE_TYPES else gptq_quantize)(w, h, q)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"added": after - before}))
"""


@pytest.mark.parametrize("qtype", ["Q4_K", "IQ3_S"])
def test_gptq_holds_few_copies_of_a_wide_hessian(qtype: str) -> None:
    """Before: 8.8 copies of the float32 Hessian at once (2.36 GB at n = 8192; 7.4 GB at n = 14336, on top
    of the caller's float64 one); then 4.2 (Q4_K) and 4.8 (IQ3_S), with a float32 copy of the caller's
    float64 Hessian held through the sweep and a float64 one made again for the lattice's scale refit;
    then 3.3 and 3.0, with torch's column-major copy beside the factor's buffer in every LAPACK call and
    ``isfinite``'s copies of the whole Hessian; now the working copy and blocks (measured 1.6 and 1.7)."""
    copies = added_peak(_PROBE, qtype, threads=2) / (8192 * 8192 * 4)
    assert copies < 2.2, f"GPTQ ({qtype}) held {copies:.1f} float32 copies of the Hessian at its peak"


def _spd(n: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n // 4, generator=g)
    return a @ a.T / n  # rank n/4: not positive definite without damping


@pytest.mark.parametrize(
    ("mode", "shift", "want_tries"), [("diag", 0.0, 0), ("mean", 0.0, 0), ("mean", 0.05, 1)]
)
def test_inverse_factor_in_one_buffer_is_the_damped_factor(mode: str, shift: float, want_tries: int) -> None:
    """The factor made in one working buffer (LAPACK in place) is that of (H + damping)⁻¹ made on fresh
    copies, bit for bit, also after a damping too small to make H positive definite (then H is built
    again); the Hessian the builder copies is unchanged."""
    import torch

    h = _spd(256)
    h -= shift * float(torch.diagonal(h).mean()) * torch.eye(256)  # indefinite: λ = 0.01 is too little
    keep = h.clone()
    built: list[int] = []

    def build():
        built.append(1)
        return h.clone()

    up, lam, tries = gptq._inverse_factor(build, 0.01, mode)
    assert (tries, len(built)) == (want_tries, want_tries + 1)
    assert torch.equal(h, keep)
    d = torch.diagonal(keep)
    hd = keep.clone()
    idx = torch.arange(256)
    hd[idx, idx] += lam * d + 1e-12 * float(d.mean()) if mode == "diag" else lam * float(d.mean())
    ref = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hd)), upper=True)
    assert torch.equal(up, ref)


def test_inverse_factor_that_no_damping_rescues_raises() -> None:
    """A negative definite Hessian raises after every damping was tried, each on a fresh copy."""
    import torch

    built: list[int] = []

    def build():
        built.append(1)
        return -torch.eye(64)

    with pytest.raises(HessianError):
        gptq._inverse_factor(build, 0.01, "mean")
    assert len(built) == 4  # λ = 0.01, 0.1, 1, 10


@pytest.mark.parametrize("n_dead", [0, 5])
def test_working_hessian_is_the_permuted_copy(n_dead: int) -> None:
    """``working_hessian`` (rows gathered, then columns in place a block at a time) is ``H[perm][:, perm]``
    with the dead columns' diagonal 1, for a width that is not a multiple of its row block."""
    import torch

    n = 700
    h = _spd(n, seed=3)
    dead = torch.arange(0, 5 * 97, 97)[:n_dead]
    h[dead, dead] = 0.0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    ref = h.clone()
    ref[dead, dead] = 1.0
    assert torch.equal(gptq.working_hessian(h, dead, perm), ref[perm][:, perm])
    assert torch.equal(gptq.working_hessian(h, dead), ref)


_TALL = """
import json, resource, sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[1])
from studio.core.quant.gptq_lattice import gptq_lattice
rows, n = 8192, 2048
g = torch.Generator().manual_seed(0)
w = torch.randn(rows, n, generator=g) * 0.02
a = torch.randn(n, 4 * n, generator=g)
h = a @ a.T / n
del a
imx = torch.diagonal(h).numpy().astype(np.float32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
gptq_lattice(w, h, "IQ3_S", imatrix=imx)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"added": after - before}))
"""


def test_the_lattice_scale_refit_of_a_tall_matrix_holds_a_block_of_rows() -> None:
    """The i-quants' super-block scale refit solves one least-squares problem per row; its products are
    rows × n × n/256 float64 values, made a block of rows at a time. All rows at once, GPTQ of this 8192 ×
    2048 weight added 2.0 GB (now 0.72 GB), and at an 8B's 4096 × 14336 ``down_proj`` it asked for 26 GB
    (GPTQ with IQ3_S ended in an allocation error there)."""
    added = added_peak(_TALL, threads=2)
    assert added < 1.0e9, f"GPTQ (IQ3_S) of an 8192 × 2048 weight added {added / 1e9:.2f} GB at its peak"


_TALL_CODES = """
import json, resource, sys
import torch
sys.path.insert(0, sys.argv[1])
from studio.core.quant import gptq as G, gptq_lattice as L
G._ERROR_ROWS = 1 << 18  # blocks far smaller than the matrix, as at an 8B's 14336 x 4096 ffn_up
L._REFIT_BLOCK = 1 << 18
rows, n = 4096, 1024
g = torch.Generator().manual_seed(0)
w = torch.randn(rows, n, generator=g) * 0.02
a = torch.randn(n, 96, generator=g, dtype=torch.float64)
h = a @ a.T
h.diagonal().add_(1.0)
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
L.gptq_lattice(w, h, "IQ3_XXS")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"added": after - before}))
"""


def test_lattice_gptq_of_a_tall_matrix_decodes_a_block_of_rows_at_a_time() -> None:
    """The lattice's scale refit decoded the whole matrix's codes at once, and its output errors decoded
    both results whole beside their products: five float32 copies of the matrix. At an 8B's ffn_up at
    IQ3_XXS that was the best-method budget export's peak (6.84 GB on the 2-layer fixture). Measured here:
    18.4 copies of the weight before, 14.6 after (the sweep's own copies and codes are the rest)."""
    copies = added_peak(_TALL_CODES, threads=2) / (4096 * 1024 * 4)
    assert copies < 16.5, f"lattice GPTQ held {copies:.1f} float32 copies of a 4096 x 1024 weight at its peak"


_REFIT = """
import json, resource, sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[1])
from studio.core.quant import iquants
from studio.core.quant.gptq_lattice import refit_super_scales
rows, n = 128, 8192
g = torch.Generator().manual_seed(0)
w = torch.randn(rows, n, generator=g) * 0.02
a = torch.randn(n, 96, generator=g)
h = a @ a.T
h.diagonal().add_(1.0)
del a
data = iquants.quantize_rows(w.numpy(), "IQ3_XXS", None)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
refit_super_scales(data, "IQ3_XXS", w, h)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"added": after - before}))
"""


def test_the_lattice_scale_refit_reads_a_float32_hessian_a_slab_at_a_time() -> None:
    """The i-quants' scale refit made a float64 copy of the export's float32 Hessian (1.64 GB at an 8B's
    14336-wide ``down_proj``: the peak of a best-method budget export on the 8B fixture, 6.84 GB); it
    reads one super-block's 256 rows (and columns) of it in float64 at a time now, to the same bytes.
    Measured at n = 8192 (a float32 copy is 268 MB): 2.6 copies added before, 0.45-0.6 now (the
    slabs, their einsum's permuted copies and the decoded levels)."""
    copies = added_peak(_REFIT, threads=2) / (8192 * 8192 * 4)
    assert copies < 1.0, f"the scale refit added {copies:.2f} float32 copies of an 8192-wide Hessian"
