"""Fixtures of the lab tests (shared exports live in tests/core/chat/fixtures.py)."""

from collections.abc import Iterator

import pytest

from tests.core.chat.fixtures import chat_model, f32_gguf, gguf_of  # noqa: F401  (fixtures)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Train on one torch thread, restored afterwards.

    On an oversubscribed 2-core machine two threads made each tiny training step 40 times slower
    (2 s against 50 ms, measured), while one thread is as fast as two on an idle one for these sizes.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
