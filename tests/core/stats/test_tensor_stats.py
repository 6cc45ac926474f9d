"""Per-tensor statistics: streamed results equal numpy's on the whole array, whatever the chunking."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.jobs import JobCancelled, JobContext
from studio.core.stats.cache import StatsCache, cache_key
from studio.core.stats.overview import OverviewMetric, model_overview
from studio.core.stats.tensor_stats import (
    OutlierKind,
    OutlierRule,
    _histogram_numpy,
    bin_edges,
    histogram,
    stats_of_array,
    tensor_stats,
)


def _weights(rows=300, cols=520, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    x[:, 7] *= 60  # an outlier input channel
    x[11, :] *= 25  # an outlier output channel
    x[5, 5] = 0.0
    return x


@pytest.mark.parametrize("chunk", [1_000, 50_000, 1 << 22], ids=["tiny-chunks", "some-chunks", "one-chunk"])
def test_stats_equal_numpy(chunk):
    x = _weights()
    s = stats_of_array(x, chunk_elements=chunk)
    assert (s.min, s.max) == (float(x.min()), float(x.max()))
    counts, _ = np.histogram(x, bins=s.hist.edges)
    np.testing.assert_array_equal(s.hist.counts, counts)
    np.testing.assert_array_equal(s.hist.edges, np.histogram_bin_edges(x.astype(np.float64), 256))
    np.testing.assert_array_equal(s.absmax_out, np.abs(x).max(axis=1))
    np.testing.assert_array_equal(s.absmax_in, np.abs(x).max(axis=0))
    x64 = x.astype(np.float64)
    assert s.mean == pytest.approx(x64.mean(), rel=1e-9)
    assert s.std == pytest.approx(x64.std(), rel=1e-6)
    d = x64 - x64.mean()
    assert s.kurtosis == pytest.approx((d**4).mean() / (d**2).mean() ** 2 - 3, rel=1e-5)
    assert s.median_abs == pytest.approx(float(np.median(np.abs(x))), rel=0.01)


def test_histogram_is_exact_at_bin_edges_and_zeros():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(200_000).astype(np.float32)
    x[:5000] = 0.0  # zero sits exactly on an edge of a symmetric range
    lo, hi = -4.0, 4.0
    edges = bin_edges(256, lo, hi)
    x[5000:5256] = edges[:-1].astype(np.float32)  # values on (float32-rounded) edges
    x = np.clip(x, lo, hi)
    np.testing.assert_array_equal(histogram(x, 256, lo, hi), np.histogram(x, bins=edges)[0])
    for bins in (7, 255, 1000):
        e = bin_edges(bins, float(x.min()), float(x.max()))
        ref = np.histogram(x, bins=e)[0]
        np.testing.assert_array_equal(histogram(x, bins, float(x.min()), float(x.max())), ref)
        # The numpy path (used without numba) and the threaded compiled path are exact too.
        np.testing.assert_array_equal(_histogram_numpy(x, e), ref)
        np.testing.assert_array_equal(histogram(x, bins, float(x.min()), float(x.max()), threads=3), ref)


def test_outlier_rules_and_shares():
    x = _weights()
    s = stats_of_array(x)
    k = OutlierRule(OutlierKind.K_MEDIAN, 5.0)
    col = np.abs(x).max(axis=0)
    np.testing.assert_array_equal(s.outlier_channels(k, "in"), np.flatnonzero(col > 5 * np.median(col)))
    assert 7 in s.outlier_channels(k, "in") and 11 in s.outlier_channels(k, "out")
    for t in (0.01, 0.05, 0.3):
        share = s.element_outlier_share(OutlierRule(OutlierKind.ABS, t))
        assert share == pytest.approx((np.abs(x) > t).mean(), rel=0.02, abs=1e-5)
    llm = OutlierRule.llm_int8()
    assert llm.threshold(123.0) == 6.0
    assert s.element_outlier_share(llm) == pytest.approx((np.abs(x) > 6).mean(), rel=0.02)
    assert s.element_outlier_share(OutlierRule(OutlierKind.ABS, 1e3)) == 0.0
    row = np.abs(x).max(axis=1)
    assert s.scale_ratio("out") == pytest.approx(row.max() / np.median(row))


def test_heat_map_is_block_max_and_at_most_512():
    x = _weights(1030, 777)
    s = stats_of_array(x, chunk_elements=40_000)
    fr, fc = s.heat_block
    assert s.heatmap.shape == (-(-1030 // fr), -(-777 // fc)) and max(s.heatmap.shape) <= 512
    a = np.abs(x)
    for i, j in ((0, 0), (100, 200), (s.heatmap.shape[0] - 1, s.heatmap.shape[1] - 1)):
        assert s.heatmap[i, j] == a[i * fr : (i + 1) * fr, j * fc : (j + 1) * fc].max()


def test_transposed_layout_swaps_channels():
    x = _weights(64, 96)
    s = stats_of_array(x, transposed=True)
    np.testing.assert_array_equal(s.absmax_out, np.abs(x).max(axis=0))
    assert s.heatmap.shape == (96, 64)


def test_nonfinite_values_are_counted_and_left_out():
    x = _weights(50, 40)
    x[3, 4], x[10, 1], x[49, 39] = np.nan, np.inf, -np.inf
    s = stats_of_array(x, chunk_elements=400)
    good = x[np.isfinite(x)]
    assert s.n_nonfinite == 3 and s.hist.counts.sum() == good.size
    assert (s.min, s.max) == (float(good.min()), float(good.max()))
    np.testing.assert_array_equal(s.hist.counts, np.histogram(good, bins=s.hist.edges)[0])


def test_one_dimensional_and_constant_tensors():
    s = stats_of_array(np.full(300, 0.5, np.float32))
    assert s.absmax_out.shape == (1,) and s.absmax_in.shape == (300,)
    assert s.hist.counts.sum() == 300 and s.std == 0.0


def test_results_are_read_only():
    s = stats_of_array(_weights(20, 30))
    with pytest.raises(ValueError):
        s.absmax_in[0] = 1.0


def test_cancellation_between_chunks():
    ctx = JobContext()
    calls = []

    def read(r0, r1):
        calls.append(r0)
        if len(calls) == 3:
            ctx.cancel()
        return np.ones((r1 - r0, 100), np.float32)

    from studio.core.stats.tensor_stats import compute_stats

    with pytest.raises(JobCancelled):
        compute_stats(read, (1000, 100), chunk_elements=1000, ctx=ctx)
    assert len(calls) == 3


def test_checkpoint_stats_stream_and_cache(llama_model, tmp_path):
    from studio.core.model import open_model

    with open_model(llama_model) as ckpt:
        name = next(t.name for t in ckpt.info.tensors if t.name.endswith("mlp.down_proj.weight"))
        cache = StatsCache()
        a = tensor_stats(ckpt, name, cache=cache, chunk_elements=10_000)
        b = tensor_stats(ckpt, name, cache=cache)
        assert a is b and cache.hits == 1 and cache.misses == 1
        x = ckpt.read(name)
        np.testing.assert_array_equal(a.absmax_out, np.abs(x).max(axis=1))
        np.testing.assert_array_equal(a.hist.counts, np.histogram(x, bins=a.hist.edges)[0])
        info = ckpt.info.tensor(name)
        assert cache_key(info, "stats:bins=256:heat=1") in cache

        ov = model_overview(ckpt, cache=cache)
        mats = [t for t in ckpt.info.tensors if len(t.shape) >= 2]
        assert len(ov.tensors) == len(mats) == len(cache)
        v = ov.values(OverviewMetric.SCALE_RATIO)
        i = ov.names().index(name)
        rows = np.abs(x).max(axis=1)
        assert v[i] == pytest.approx(rows.max() / np.median(rows))


def test_cache_key_changes_with_the_file(tmp_path):
    from studio.core.modelinfo import Role, TensorInfo

    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x" * 10)
    info = TensorInfo("w", (2, 5), "F32", 40, f, Role.OTHER)
    k1 = cache_key(info)
    f.write_bytes(b"y" * 11)
    assert cache_key(info) != k1


def test_cache_evicts_by_bytes_and_computes_once_under_contention():
    import threading
    import time

    cache = StatsCache(max_bytes=3000)

    class V:
        nbytes = 1000

    for i in range(5):
        cache.put(("k", i), V())
    assert len(cache) == 3 and cache.get(("k", 0)) is None and cache.get(("k", 4)) is not None

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.1)
        return V()

    out = []
    threads = [
        threading.Thread(target=lambda: out.append(cache.get_or_compute(("same",), slow))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(v) for v in out}) == 1


def test_prepare_kernels_compiles_what_a_read_only_weight_needs():
    # a weight read from a file is a read-only array, another type to numba: compiling it in the first
    # statistics job held the GIL ~0.3 s at a time (bench/gui_responsiveness.py's cold statistics phase)
    from studio.core.stats import _hist_kernel, tensor_stats

    if not tensor_stats.prepare_kernels():
        pytest.skip("numba is not available")
    kernel = _hist_kernel.histogram_into
    before = len(kernel.signatures)
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    x.flags.writeable = False
    counts = tensor_stats.histogram(x, 10, -1.0, 1.0, threads=1)
    assert counts.sum() == 1000 and len(kernel.signatures) == before
