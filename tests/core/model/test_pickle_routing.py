"""Item 4 of issue 10: the transformers original (chat back end, evaluation) never unpickles in this
process. A pickle-only folder is refused with the opt-in sentence, or, opted in, read through
``open_model``'s child conversion and cached safetensors, giving what the safetensors model gives."""

from __future__ import annotations

import shutil

import pytest

from studio.core.chat import Sampling, generate
from studio.core.chat.hf_backend import TransformersBackend
from studio.core.chat.hf_process import TransformersChildBackend
from studio.core.chat.types import Message
from studio.core.errors import StudioError, UnsafeFileError
from studio.core.evaluate import evaluate
from studio.core.model.hf_folder import holds_only_pickles, transformers_folder
from tests.core.chat import fixtures as _fixtures

torch = pytest.importorskip("torch")
gguf_of = _fixtures.gguf_of  # the shared, cached exports


class _Canary:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def pickle_model(llama_model, tmp_path_factory):
    """The tiny Llama with its weights as pytorch_model.bin only (same tensors, torch.save)."""
    from safetensors.torch import load_file

    folder = tmp_path_factory.mktemp("pickle") / "llama-bin"
    shutil.copytree(llama_model, folder)
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return folder


@pytest.fixture
def no_unpickling_here(monkeypatch):
    """Fail the test if this process calls torch.load (the child process is another interpreter)."""
    calls = []

    def banned(*a, **k):
        calls.append(a)
        raise AssertionError("torch.load ran in the test process")

    monkeypatch.setattr(torch, "load", banned)
    return calls


def _greedy(b) -> tuple[int, ...]:
    b.load()
    try:
        return generate(b, [Message("user", "Hello there")], Sampling(max_tokens=8)).token_ids
    finally:
        b.close()


def test_the_chat_original_refuses_pickles_without_opt_in(
    pickle_model, no_unpickling_here, tmp_path, monkeypatch
):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    assert holds_only_pickles(pickle_model)
    with pytest.raises(UnsafeFileError, match="pytorch_model.bin is a pickle checkpoint.*opt in"):
        TransformersBackend(pickle_model, n_ctx=128, device="cpu").load()
    assert no_unpickling_here == [] and not (tmp_path / "cache").exists()


def test_opted_in_the_chat_original_reads_the_child_conversion(
    pickle_model, llama_model, no_unpickling_here, tmp_path, monkeypatch
):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    want = _greedy(TransformersBackend(llama_model, n_ctx=128, device="cpu"))
    got = _greedy(TransformersBackend(pickle_model, n_ctx=128, device="cpu", allow_pickle=True))
    assert got == want and no_unpickling_here == []
    loaded_from = transformers_folder(pickle_model, allow_pickle=True)
    assert loaded_from != pickle_model and (loaded_from / "model.safetensors").is_file()
    assert str(loaded_from).startswith(str(tmp_path / "cache"))  # the cached conversion, reused
    assert not any(p.suffix == ".bin" for p in loaded_from.iterdir())


def test_the_chat_column_in_its_child_refuses_pickles_or_reads_the_conversion(
    pickle_model, llama_model, no_unpickling_here, tmp_path, monkeypatch
):
    # the chat's column loads in a child: the refusal comes before it starts, and the conversion is
    # made here (in the pickle loader's own child) so the transformers child reads safetensors only
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    refused = TransformersChildBackend(pickle_model, n_ctx=128, device="cpu")
    with pytest.raises(UnsafeFileError, match="pytorch_model.bin is a pickle checkpoint.*opt in"):
        refused.load()
    assert refused.worker is None
    want = _greedy(TransformersChildBackend(llama_model, n_ctx=128, device="cpu"))
    got = _greedy(TransformersChildBackend(pickle_model, n_ctx=128, device="cpu", allow_pickle=True))
    assert got == want and len(got) > 0 and no_unpickling_here == []


def test_evaluation_original_refuses_or_routes_pickles(
    pickle_model, llama_model, gguf_of, no_unpickling_here, tmp_path, monkeypatch
):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    q8 = gguf_of(llama_model, "Q8_0")
    with pytest.raises(StudioError, match="pickle checkpoint.*opt in"):
        evaluate(pickle_model, [q8], n_ctx=64, max_chunks=1, device="cpu")
    ref = evaluate(llama_model, [q8], n_ctx=64, max_chunks=2, device="cpu")
    got = evaluate(pickle_model, [q8], n_ctx=64, max_chunks=2, device="cpu", allow_pickle=True)
    assert no_unpickling_here == []
    assert got.original.ppl == ref.original.ppl and got.variants[0].kld_mean == ref.variants[0].kld_mean


def test_a_malicious_pickle_is_refused_even_opted_in(llama_model, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "evil"
    shutil.copytree(llama_model, folder)
    (folder / "model.safetensors").unlink()
    canary = tmp_path / "canary"
    torch.save({"model.norm.weight": torch.ones(4), "evil": _Canary(canary)}, folder / "pytorch_model.bin")
    with pytest.raises(UnsafeFileError, match="refused"):
        TransformersBackend(folder, n_ctx=64, device="cpu", allow_pickle=True).load()
    assert not canary.exists()
