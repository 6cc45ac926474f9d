"""Child-side op of ``bench/chat_tps.py --extra-buffers-ab``: llama.cpp speed timed inside the child.

Loaded with ``LlamaRunner(extra_ops="_llama_bench_ops")`` (the bench folder is on the spawned
child's ``sys.path``). Timing in the child leaves the pipe out, so only llama.cpp's kernels count.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def _op_bench_decode(state: Any, ids: list[int], n_gen: int, one_by_one: bool = False) -> dict[str, float]:
    """Evaluate ``ids`` (as one batch, or one token per decode), then ``n_gen`` greedy tokens one by one."""
    import llama_cpp

    from studio.core.llamacpp.worker import _need, before_decode

    llm = _need(state)
    before_decode(state)
    llm.reset()
    t0 = time.perf_counter()
    if one_by_one:
        for t in ids:
            llm.eval([int(t)])
    else:
        llm.eval([int(t) for t in ids])
    t1 = time.perf_counter()
    n_vocab = llm.n_vocab()
    ctx = llm._ctx.ctx
    made = 0
    for _ in range(n_gen):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        llm.eval([int(np.argmax(logits))])
        made += 1
    t2 = time.perf_counter()
    return {"prompt_s": t1 - t0, "gen_s": t2 - t1, "n_prompt": len(ids), "n_gen": made}


OPS = {"bench_decode": _op_bench_decode}
