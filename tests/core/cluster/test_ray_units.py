"""Calibrated quantization and evaluation on a real local Ray cluster give what they give in process:
the same GPTQ file, byte for byte, and the same evaluation numbers."""

from __future__ import annotations

import pytest
import torch

from tests.core.chat.fixtures import chat_model, gguf_of  # noqa: F401  (fixtures)
from tests.core.cluster.conftest import ray_or_skip

ray_or_skip()


def _plan(model, method):
    from studio.core.model import open_model
    from studio.core.plan.plan import plan_from_preset, with_method

    with open_model(model) as ck:
        info = ck.info
    return with_method(plan_from_preset(info, "Q4_K_M"), info, method)


@pytest.mark.parametrize("method", ["gptq", "awq+gptq"])
def test_gptq_file_bytes_are_the_same_through_the_cluster(
    local_cluster, llama_model, calib_text, tmp_path, method
):
    from studio.core.calib.quantize import export_calibrated

    plan = _plan(llama_model, method)
    kw = dict(text=calib_text, n_ctx=64, n_chunks=4, device="cpu")
    threads = torch.get_num_threads()
    # as each Ray worker runs: bitwise when the thread counts match (the head's layer passes, which make
    # the Hessians, run at the same count in both)
    torch.set_num_threads(1)
    try:
        here = export_calibrated(llama_model, tmp_path / "here.gguf", plan, **kw)
        there = export_calibrated(llama_model, tmp_path / "there.gguf", plan, executor=local_cluster, **kw)
    finally:
        torch.set_num_threads(threads)
    assert here.export.path.read_bytes() == there.export.path.read_bytes()
    assert [t.method for lr in there.layers for t in lr.tensors] == [
        t.method for lr in here.layers for t in lr.tensors
    ]
    assert method in {t.method for lr in there.layers for t in lr.tensors}


def test_evaluation_numbers_are_the_same_through_the_cluster(local_cluster, chat_model, gguf_of):  # noqa: F811
    from studio.core.evaluate import evaluate

    variants = [gguf_of(chat_model, p) for p in ("Q8_0", "Q2_K")]
    kw = dict(n_ctx=64, max_chunks=3, device="cpu")
    here = evaluate(chat_model, [*variants, chat_model], **kw)
    there = evaluate(chat_model, [*variants, chat_model], executor=local_cluster, **kw)
    assert there.original == here.original
    assert len(there.variants) == 3
    for a, b in zip(here.variants[:2], there.variants[:2], strict=True):
        assert b.error is None and a.label == b.label and a.n_scored == b.n_scored > 0
        for f in ("ppl", "ppl_err", "kld_mean", "kld_median", "kld_p99", "kld_max", "same_top_pct"):
            assert getattr(b, f) == getattr(a, f), f
    # a folder given as a variant is still refused as in process, the others scored
    assert there.variants[2].error == here.variants[2].error and "folder" in there.variants[2].error
