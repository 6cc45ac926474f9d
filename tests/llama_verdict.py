"""llama.cpp's measurement of a file (``studio.core.evaluate.last_word.llama_kl``) replaced at the core seam,
for the tests of llama.cpp's last word on a budget file (the command line's and the window's)."""

from __future__ import annotations

from collections.abc import Callable

from studio.core.evaluate import last_word


def stub_llama_kl(monkeypatch, kl_of: Callable[[str], float]) -> list[str]:
    """llama.cpp's KL of each file replaced by ``kl_of(path)``; returns the paths measured, in order."""
    seen: list[str] = []

    def measure(path, model, text, *, max_tokens, extra_buffers):
        seen.append(str(path))
        return kl_of(str(path)), max_tokens

    monkeypatch.setattr(last_word, "llama_kl", measure)
    return seen
