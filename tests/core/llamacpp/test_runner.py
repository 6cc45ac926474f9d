"""The one way to load a GGUF: extra buffers decided per machine, a first-decode crash retried once.

The crash of llama.cpp #20824 (a child killed by a signal in its first decode with extra buffers on)
is made on any machine with the worker's test hook (``QUANT_STUDIO_TEST_REPACK_CRASH``), and for real
where the CPU has AMX.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import ChildProcessError_, StudioError
from studio.core.llamacpp import (
    EXTRA_BUFFERS_ENV,
    ExtraBuffers,
    LlamaRunner,
    LoadOptions,
    parse_extra_buffers,
    resolve_extra_buffers,
)
from studio.core.llamacpp import runner as runner_mod
from studio.core.llamacpp.cpu import amx_in_cpuinfo, amx_in_system_info, cpu_has_amx
from studio.core.llamacpp.memory import (
    MachineChoice,
    forget_choice,
    memory_path,
    remember_choice,
    remembered_choice,
)
from studio.core.llamacpp.options import requested_extra_buffers
from studio.core.llamacpp.worker import TEST_CRASH_ENV

CPUINFO_AMX = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    "flags\t\t: fpu vme sse sse2 avx avx2 avx512f amx_bf16 avx512_fp16 amx_tile amx_int8\n\n"
)
CPUINFO_AVX2 = "processor\t: 0\nmodel name\t: AMD Ryzen 7 5800X\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
CPUINFO_ARM = "processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm aes pmull sha1\n"
SYSINFO_AMX = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | REPACK = 1 | "
SYSINFO_NO = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | LLAMAFILE = 1 | REPACK = 1 | "


def one_sentence(text: str) -> bool:
    """One sentence: it ends with a full stop and has no other sentence end (". ", "! ", "? ") inside."""
    return text.endswith(".") and not re.search(r"[.!?]\s", text) and "\n" not in text


@pytest.fixture
def memory_dir(tmp_path, monkeypatch):
    """A private cache for the remembered choice, and no process-wide preference."""
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(EXTRA_BUFFERS_ENV, raising=False)
    monkeypatch.delenv(TEST_CRASH_ENV, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def no_amx(monkeypatch):
    """Make this machine look like a CPU without AMX, so ``auto`` means extra buffers on."""
    monkeypatch.setattr(runner_mod, "cpu_has_amx", lambda: False)


# ------------------------------------------------------------------------------------ pure rules


def test_amx_is_read_from_cpu_flags_and_from_llama_cpps_system_info(tmp_path):
    assert amx_in_cpuinfo(CPUINFO_AMX) is True
    assert amx_in_cpuinfo(CPUINFO_AVX2) is False
    assert amx_in_cpuinfo("model name : AMX-9000 without the flag\nflags : sse avx\n") is False
    assert amx_in_system_info(SYSINFO_AMX) is True
    assert amx_in_system_info(SYSINFO_NO) is False
    f = tmp_path / "cpuinfo"
    for text, want in ((CPUINFO_AMX, True), (CPUINFO_AVX2, False), (CPUINFO_ARM, None)):
        f.write_text(text)
        assert cpu_has_amx(f) is want
    assert cpu_has_amx(tmp_path / "missing") is None  # not Linux: the child's system info decides


def test_the_decision_table():
    amx, none = True, None
    remembered_off = MachineChoice(False, "SIGSEGV in the first decode of x.gguf")
    on, off, auto = ExtraBuffers.ON, ExtraBuffers.OFF, ExtraBuffers.AUTO
    assert resolve_extra_buffers(on, amx=amx, remembered=remembered_off) == runner_mod.ExtraBuffersDecision(
        True, "asked"
    )
    assert resolve_extra_buffers(off, amx=False, remembered=None).use is False
    assert resolve_extra_buffers(auto, amx=False, remembered=remembered_off).why == "remembered"
    assert resolve_extra_buffers(auto, amx=False, remembered=remembered_off).use is False
    assert resolve_extra_buffers(auto, amx=amx, remembered=None) == runner_mod.ExtraBuffersDecision(
        False, "amx"
    )
    assert resolve_extra_buffers(auto, amx=False, remembered=None) == runner_mod.ExtraBuffersDecision(
        True, "default"
    )
    assert resolve_extra_buffers(auto, amx=none, remembered=None).use is True


def test_choices_parse_and_the_window_preference_steers_auto(monkeypatch):
    assert parse_extra_buffers(" OFF ") is ExtraBuffers.OFF and parse_extra_buffers(None) is ExtraBuffers.AUTO
    with pytest.raises(StudioError, match="auto, on, off"):
        parse_extra_buffers("sometimes")
    with pytest.raises(StudioError):
        LoadOptions(extra_buffers="maybe")
    monkeypatch.setenv(EXTRA_BUFFERS_ENV, "off")
    assert requested_extra_buffers("auto") is ExtraBuffers.OFF
    assert requested_extra_buffers("on") is ExtraBuffers.ON  # an explicit choice wins
    monkeypatch.setenv(EXTRA_BUFFERS_ENV, "garbage")
    assert requested_extra_buffers("auto") is ExtraBuffers.AUTO


def test_the_remembered_choice_is_per_machine_and_survives_a_bad_file(memory_dir):
    assert remembered_choice() is None
    path = remember_choice(False, "SIGSEGV in the first decode of a.gguf")
    assert path == memory_path() and path.parent == memory_dir
    got = remembered_choice()
    assert got is not None and got.extra_buffers is False and "a.gguf" in got.reason and got.when > 0
    assert remembered_choice(key="another machine | CPU | llama-cpp-python 9.9") is None
    data = json.loads(path.read_text())
    assert data["format"] == 1 and len(data["machines"]) == 1
    assert not any(k.startswith("/") for k in data["machines"])
    assert forget_choice() is True and remembered_choice() is None and forget_choice() is False
    path.write_text("{not json")
    assert remembered_choice() is None
    assert remember_choice(False, "again") == path and remembered_choice().reason == "again"


# ---------------------------------------------------------------------------------- real loads


def test_auto_on_an_amx_cpu_loads_without_extra_buffers(memory_dir, monkeypatch, gguf_of, chat_model):
    monkeypatch.setattr(runner_mod, "cpu_has_amx", lambda: True)
    with LlamaRunner() as r:
        info = r.load(gguf_of(chat_model, "Q8_0"), LoadOptions(n_ctx=64))
        assert r.decision == runner_mod.ExtraBuffersDecision(False, "amx")
        # what llama-cpp-python really passed to llama_model_load_from_file
        assert info["extra_buffers"] is False and r.extra_buffers is False
        info = r.load(gguf_of(chat_model, "Q8_0"), LoadOptions(n_ctx=64, extra_buffers="on"))
        assert info["extra_buffers"] is True and r.decision.why == "asked"


def test_without_amx_the_child_asks_llama_cpp(memory_dir, monkeypatch, gguf_of, chat_model):
    monkeypatch.setattr(runner_mod, "cpu_has_amx", lambda: None)  # as on macOS or Windows
    with LlamaRunner() as r:
        info = r.load(gguf_of(chat_model, "F32"), LoadOptions(n_ctx=64, vocab_only=True))
        text = r.request("system_info")
        assert "CPU" in text
        assert r.decision.use is (not amx_in_system_info(text))
        assert info["extra_buffers"] is r.decision.use


def _logits(runner: LlamaRunner, ids: list[int]) -> np.ndarray:
    return np.asarray(runner.request("eval_logits", ids=ids), dtype=np.float32)


def test_a_child_that_dies_in_its_first_decode_is_restarted_once_without_extra_buffers(
    memory_dir, no_amx, monkeypatch, gguf_of, chat_model
):
    q8 = gguf_of(chat_model, "Q8_0")
    with LlamaRunner() as r:
        r.load(q8, LoadOptions(n_ctx=64, logits_all=True, extra_buffers="off"))
        ids = r.request("tokenize", text="The mill wheel turns by the river.", add_bos=True)
        assert len(ids) > 4
        want = _logits(r, ids)
    monkeypatch.setenv(TEST_CRASH_ENV, "decode")  # the child dies by SIGSEGV if extra buffers are on
    seen: list[str] = []
    with LlamaRunner(on_note=seen.append) as r:
        info = r.load(q8, LoadOptions(n_ctx=64, logits_all=True))
        assert r.decision.use is True and info["extra_buffers"] is True
        first_pid = r.worker.pid
        got = _logits(r, ids)
        assert r.worker.pid != first_pid and r.alive  # exactly one restart ...
        assert r.extra_buffers is False  # ... with extra buffers off
        np.testing.assert_array_equal(got, want)  # and the answer is the one without them
        assert len(seen) == 1 and seen == list(r.notes)
        assert one_sentence(seen[0]), seen[0]
        assert "SIGSEGV" in seen[0] and "first decode" in seen[0] and q8.name in seen[0]
        # the machine remembers: the next auto load starts without extra buffers
        assert remembered_choice().extra_buffers is False
        pid = r.worker.pid
        np.testing.assert_array_equal(_logits(r, ids), want)
        assert r.worker.pid == pid and len(seen) == 1
        r.load(q8, LoadOptions(n_ctx=64, logits_all=True))
        assert r.decision.why == "remembered" and r.extra_buffers is False
        # a later death is an error, not another retry
        with pytest.raises(ChildProcessError_, match="SIGSEGV"):
            r.request("crash", how="segv")
        assert not r.alive and len(seen) == 1


def test_a_child_that_dies_while_loading_is_restarted_once(
    memory_dir, no_amx, monkeypatch, gguf_of, chat_model
):
    monkeypatch.setenv(TEST_CRASH_ENV, "load")
    with LlamaRunner() as r:
        info = r.load(gguf_of(chat_model, "Q8_0"), LoadOptions(n_ctx=64))
        assert info["extra_buffers"] is False and r.extra_buffers is False
        assert len(r.notes) == 1 and "while loading" in r.notes[0]
    # extra buffers off from the start: the same death is not retried, it is the caller's error
    forget_choice()
    with LlamaRunner() as r:
        r.load(gguf_of(chat_model, "Q8_0"), LoadOptions(n_ctx=64, extra_buffers="off"))
        with pytest.raises(ChildProcessError_):
            r.request("crash")
        assert r.notes == ()


def test_a_streaming_first_decode_is_retried_in_chat(memory_dir, no_amx, monkeypatch, gguf_of, chat_model):
    from studio.core.chat import ChatSession, Sampling
    from studio.core.chat.llama_backend import LlamaCppBackend

    q8 = gguf_of(chat_model, "Q8_0")
    plain = LlamaCppBackend(q8, n_ctx=128, extra_buffers="off")
    want = ChatSession([plain]).send("Hello there", Sampling(max_tokens=6))[0]
    plain.close()
    monkeypatch.setenv(TEST_CRASH_ENV, "decode")
    b = LlamaCppBackend(q8, n_ctx=128, extra_buffers="on")
    s = ChatSession([b])
    try:
        (out,) = s.send("Hello there", Sampling(max_tokens=6))
        assert out.error is None, out.error
        assert out.result.token_ids == want.result.token_ids
        assert len(out.notes) == 1 and "SIGSEGV" in out.notes[0] and q8.name in out.notes[0]
        (again,) = s.send("And again", Sampling(max_tokens=3))
        assert again.error is None and again.notes == ()  # told once
    finally:
        s.close()


@pytest.mark.skipif(cpu_has_amx() is not True, reason="needs a CPU with AMX (llama.cpp #20824 for real)")
def test_the_real_amx_crash_is_survived(memory_dir, gguf_of, chat_model):
    """On this CPU, Q8_0 with extra buffers on really dies in its first decode; the runner survives it."""
    q8 = gguf_of(chat_model, "Q8_0")
    with LlamaRunner() as r:
        r.load(q8, LoadOptions(n_ctx=64, logits_all=True, extra_buffers="off"))
        want = _logits(r, [1, 2, 3, 4])
    with LlamaRunner() as r:
        r.load(q8, LoadOptions(n_ctx=64, logits_all=True, extra_buffers="on"))
        pid = r.worker.pid
        np.testing.assert_array_equal(_logits(r, [1, 2, 3, 4]), want)
        assert r.worker.pid != pid and len(r.notes) == 1
        assert re.search(r"\((SIGSEGV|SIGILL|SIGBUS)\)", r.notes[0])


def test_no_test_or_module_loads_llama_cpp_in_process():
    """Every GGUF load goes through LlamaRunner's child: nothing else calls ``llama_cpp.Llama(...)``."""
    import ast

    root = Path(__file__).resolve().parents[3]
    # the worker is the child; the bench's reference is llama-cpp-python called directly, on purpose,
    # with the runner's extra-buffer decision (model_params)
    allowed = {
        root / "studio/core/llamacpp/worker.py",
        root / "bench/chat_tps.py",
        root / "bench/chat_latency.py",  # issue 26: the chat against llama_cpp called directly
    }
    loaders = {"Llama", "llama_model_load_from_file", "llama_load_model_from_file"}
    offenders = []
    for folder in ("studio", "tests", "bench"):
        for path in (root / folder).rglob("*.py"):
            if path in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                    if name in loaders:
                        offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders


def test_every_load_passes_an_extra_buffers_decision():
    """The child's load op has no default for extra buffers, so a bare request cannot bypass the rules."""
    import inspect

    from studio.core.llamacpp.worker import _op_load

    p = inspect.signature(_op_load).parameters["extra_buffers"]
    assert p.default is inspect.Parameter.empty and p.kind is inspect.Parameter.KEYWORD_ONLY
    assert signal.SIGSEGV  # the hook's signal exists on this platform
