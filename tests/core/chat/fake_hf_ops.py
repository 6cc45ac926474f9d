"""Child-side test double for ``TransformersChildBackend(extra_ops="tests.core.chat.fake_hf_ops")``:
``hf_load`` dies by SIGKILL, as the kernel's out-of-memory killer ends a child loading a model too big."""

from __future__ import annotations

import os
import signal
from typing import Any

from studio.core.chat.hf_ops import OPS as _REAL

USES_LLAMA_CPP = False


def _load(state: Any, **kwargs: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


OPS = {**_REAL, "hf_load": _load}
