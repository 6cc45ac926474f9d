"""Child-side test doubles for ``LlamaWorker(extra_ops="tests.core.chat.fake_ops")``.

``chat_load`` here fails like a GPU that is too small (any GPU layers, or a context above 256) and
otherwise loads for real; ``FAKE_CRASH_ON_LOAD`` in the environment makes it die with SIGSEGV the way
llama.cpp does on a malicious file.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from studio.core.chat.llama_ops import OPS as _REAL

MAX_CTX = 256


def _load(state: Any, path: str, n_gpu_layers: int = 0, n_ctx: int = 512, **kw: Any) -> Any:
    if os.environ.get("FAKE_CRASH_ON_LOAD"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if n_gpu_layers != 0:
        raise ValueError(f"Failed to create llama_context: CUDA out of memory with {n_gpu_layers} GPU layers")
    if n_ctx > MAX_CTX:
        raise ValueError(f"Failed to create llama_context: cannot allocate a KV cache for {n_ctx} tokens")
    return _REAL["chat_load"](state, path=path, n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, **kw)


OPS = {**_REAL, "chat_load": _load}
