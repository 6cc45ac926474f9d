"""llama.cpp in a child process: a small request/response protocol over a multiprocessing pipe.

llama.cpp aborts the whole process on some malformed files and can exhaust memory on big models,
so every llama.cpp call of the studio runs in a spawned child. The parent sends
``{"op": name, "args": {...}}``; the child answers ``{"ok": True, "result": ...}``, or
``{"ok": False, "error": text}``, or for streaming ops a series of ``{"partial": item}`` messages
followed by the final answer. A child that dies (SIGSEGV, abort, OOM kill) becomes a
``ChildProcessError_`` naming the signal, and the parent keeps running.

Ops served by the child (see ``_OPS``): ping, load, unload, tokenize, detokenize, eval_logits,
embed, chat, generate_stream, quantize. Other modules may add ops by passing
``extra_ops="package.module"`` whose ``OPS`` dict maps names to ``fn(state, **args)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

from studio.core import errors
from studio.core.errors import ChildProcessError_
from studio.core.llamacpp.kvcache import llama_kwargs

_CTX = mp.get_context("spawn")


def _signal_name(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class LlamaWorker:
    """A child process that runs llama.cpp for the parent; use as a context manager."""

    def __init__(
        self, *, label: str = "llama.cpp", extra_ops: str | None = None, start_timeout: float = 120.0
    ):
        self.label = label
        parent, child = _CTX.Pipe(duplex=True)
        self._conn = parent
        self._proc = _CTX.Process(target=_serve, args=(child, extra_ops), daemon=True, name="studio-llamacpp")
        self._proc.start()
        child.close()
        self._busy = False
        self._killed = False  # set when the parent stopped the child (a timeout, close)
        self.request("ping", timeout=start_timeout)

    @property
    def pid(self) -> int | None:
        """Process id of the child."""
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the child is still running."""
        return self._proc.is_alive()

    @property
    def exit_signal(self) -> int | None:
        """The signal that ended the child on its own (a crash), or None (alive, exited, or killed by us)."""
        if self._killed or self._proc.is_alive():
            return None
        self._proc.join(timeout=1.0)
        code = self._proc.exitcode
        return -code if isinstance(code, int) and code < 0 else None

    @property
    def exit_how(self) -> str:
        """``signal SIGSEGV`` / ``exit code 1`` / ``no exit code`` of the child."""
        if not self._proc.is_alive():
            self._proc.join(timeout=1.0)
        return _signal_name(self._proc.exitcode)

    def __enter__(self) -> LlamaWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _dead_error(self, what: str) -> ChildProcessError_:
        self._proc.join(timeout=1.0)
        code = self._proc.exitcode
        return ChildProcessError_(
            f"{self.label} stopped unexpectedly ({_signal_name(code)}) while {what}.",
            hint="The file may be damaged or too large for this machine's memory.",
        )

    def _recv(self, what: str, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if self._conn.poll(0.05):
                    return self._conn.recv()
            except (EOFError, OSError):
                raise self._dead_error(what) from None
            if not self._proc.is_alive():
                # drain a last message that raced with the exit
                with contextlib.suppress(EOFError, OSError):
                    if self._conn.poll(0):
                        return self._conn.recv()
                raise self._dead_error(what)
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
                raise ChildProcessError_(
                    f"{self.label} did not answer within {timeout:.0f} s while {what}; it was stopped."
                )

    def _send(self, op: str, args: dict[str, Any]) -> None:
        if not self._proc.is_alive():
            raise self._dead_error(f"starting {op}")
        try:
            self._conn.send({"op": op, "args": args})
        except (BrokenPipeError, OSError):
            raise self._dead_error(f"sending {op}") from None

    def request(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        """Run ``op`` in the child and return its result; errors become StudioErrors."""
        self._send(op, args)
        while True:
            msg = self._recv(f"running {op}", timeout)
            if "partial" in msg:
                continue
            return _unwrap(msg)

    def stream(self, op: str, timeout: float | None = None, **args: Any) -> Iterator[Any]:
        """Run a streaming ``op``; yields its partial items, then returns (result in StopIteration)."""
        self._send(op, args)
        while True:
            msg = self._recv(f"running {op}", timeout)
            if "partial" in msg:
                yield msg["partial"]
                continue
            return _unwrap(msg)

    def kill(self) -> None:
        """Stop the child at once."""
        self._killed = True
        with contextlib.suppress(Exception):
            self._proc.kill()
        self._proc.join(timeout=5.0)

    def close(self, timeout: float = 5.0) -> None:
        """Ask the child to exit; kill it if it does not within ``timeout`` seconds."""
        if self._proc.is_alive():
            with contextlib.suppress(Exception):
                self._conn.send({"op": "exit", "args": {}})
            self._proc.join(timeout=timeout)
        if self._proc.is_alive():
            self.kill()
        with contextlib.suppress(Exception):
            self._conn.close()


def _unwrap(msg: dict[str, Any]) -> Any:
    if msg.get("ok"):
        return msg.get("result")

    cls = getattr(errors, str(msg.get("kind", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.StudioError)):
        cls = ChildProcessError_
    raise cls(str(msg.get("error", "llama.cpp failed.")))


# ------------------------------------------------------------------------------------------ child side


class _State:
    def __init__(self) -> None:
        self.llm: Any = None
        self.path: str | None = None
        self.extra_buffers = False  # what the loaded model was loaded with
        self.decoded = False  # whether it has decoded since it was loaded


def _serve(conn: Any, extra_ops: str | None) -> None:
    """Child main loop: answer requests until told to exit or the pipe closes."""
    ops = dict(_OPS)
    module = importlib.import_module(extra_ops) if extra_ops else None
    if module is not None:
        ops.update(module.OPS)
    state = _State()
    # a child that serves another library (the transformers column) leaves llama.cpp unimported
    quiet = getattr(module, "USES_LLAMA_CPP", True)
    log_callback = _quiet_llamacpp() if quiet else None  # noqa: F841 - ctypes needs it alive while the child runs
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        op = msg.get("op")
        if op == "exit":
            return
        fn = ops.get(op)
        try:
            if fn is None:
                raise ValueError(f"unknown op {op!r}")
            result = fn(state, **msg.get("args", {}))
            if hasattr(result, "__next__"):
                for item in result:  # generator: stream partial items, then the final value
                    conn.send({"partial": item})
                result = None
            conn.send({"ok": True, "result": result})
        except BaseException as err:  # noqa: BLE001 - everything goes back to the parent
            kind = type(err).__name__
            text = getattr(err, "message", None) or str(err) or kind
            with contextlib.suppress(Exception):
                conn.send({"ok": False, "error": text, "kind": kind, "trace": traceback.format_exc(limit=5)})


# ggml's log levels (ggml.h); llama-cpp-python 0.3.x still maps the older numbering, so with
# verbose=False it prints every warning (per-tensor quantize overrides, pooling notices) and drops errors.
_GGML_LOG_ERROR = 4
_GGML_LOG_CONT = 5


def _log_filter() -> Any:
    """A ggml log callback that writes only errors (and their continuation lines) to stderr."""
    import llama_cpp

    last = [0]

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if level != _GGML_LOG_CONT:
            last[0] = level
        if last[0] == _GGML_LOG_ERROR:
            sys.stderr.write(text.decode("utf-8", "replace"))
            sys.stderr.flush()

    return callback


def _quiet_llamacpp() -> Any:
    """Route llama.cpp's log to ``_log_filter``; returns the callback, which must stay referenced."""
    try:
        import llama_cpp
        from llama_cpp import _logger

        _logger.set_verbose(False)
        callback = _log_filter()
        llama_cpp.llama_log_set(callback, None)
        return callback
    except Exception:  # pragma: no cover - older llama-cpp-python
        return None


TEST_CRASH_ENV = "QUANT_STUDIO_TEST_REPACK_CRASH"
"""Test hook: ``decode`` (or ``load``) makes this child die by SIGSEGV in its first decode (or while
loading) whenever extra buffers are on, the way llama.cpp #20824 does on AMX CPUs."""


@contextlib.contextmanager
def model_params(extra_buffers: bool) -> Iterator[None]:
    """Make llama-cpp-python's ``Llama(...)`` load with ``use_extra_bufts = extra_buffers``.

    ``Llama`` takes no such argument in 0.3.36; it builds its parameters from
    ``llama_model_default_params()``, so that one call is wrapped for the duration of the load.
    """
    import llama_cpp.llama_cpp as low

    original = low.llama_model_default_params

    def params() -> Any:
        p = original()
        p.use_extra_bufts = bool(extra_buffers)
        return p

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = original


def _test_crash(state: _State, when: str) -> None:
    if state.extra_buffers and os.environ.get(TEST_CRASH_ENV) == when:
        os.kill(os.getpid(), signal.SIGSEGV)


def before_decode(state: _State) -> None:
    """Every op that decodes calls this first (the test hook for a crash in the first decode)."""
    if not state.decoded:
        _test_crash(state, "decode")
        state.decoded = True


def _op_ping(state: _State) -> str:
    return "pong"


def _op_system_info(state: _State) -> str:
    """llama.cpp's line of CPU features in use (``... | AMX_INT8 = 1 | ...``)."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace")


def _op_load(
    state: _State,
    path: str,
    *,
    extra_buffers: bool,
    n_ctx: int = 512,
    f32_kv: bool = True,
    logits_all: bool = False,
    embedding: bool = False,
    vocab_only: bool = False,
    n_threads: int | None = None,
    seed: int = 0,
    chat_format: str | None = None,
    n_gpu_layers: int = 0,
    kv_type: str | None = None,
) -> dict[str, Any]:
    import llama_cpp

    kwargs: dict[str, Any] = dict(
        model_path=path,
        n_ctx=n_ctx,
        logits_all=logits_all,
        embedding=embedding,
        vocab_only=vocab_only,
        verbose=False,
        seed=seed,
        n_gpu_layers=n_gpu_layers,
    )
    if n_threads:
        kwargs["n_threads"] = n_threads
        kwargs["n_threads_batch"] = n_threads
    if kv_type:  # the lab's KV-cache precision (f32, f16, q8_0, q4_0); a quantized V needs flash attention
        kwargs.update(llama_kwargs(kv_type))
    elif f32_kv:
        kwargs["type_k"] = 0  # GGML_TYPE_F32: the default F16 cache alone moves logits by ~1e-2
        kwargs["type_v"] = 0
    if embedding:
        kwargs["pooling_type"] = llama_cpp.LLAMA_POOLING_TYPE_NONE
    if chat_format:
        kwargs["chat_format"] = chat_format
    # extra_buffers has no default: every load is decided by studio.core.llamacpp.runner, the one way
    state.llm = None
    state.path = None
    state.extra_buffers = bool(extra_buffers)
    state.decoded = False
    _test_crash(state, "load")
    try:
        with model_params(state.extra_buffers):
            state.llm = llama_cpp.Llama(**kwargs)
    except ValueError as err:
        raise RuntimeError(f"llama.cpp could not load {path}: {err}") from None
    state.path = path
    llm = state.llm
    meta = dict(getattr(llm, "metadata", {}) or {})
    # llama.cpp pads small contexts (to 256) but llama-cpp-python sizes its buffers as asked:
    # report the smaller, usable size.
    usable = min(llm.n_ctx(), n_ctx) if n_ctx else llm.n_ctx()
    return {
        "n_vocab": llm.n_vocab(),
        "n_ctx": usable,
        "metadata": meta,
        "extra_buffers": bool(llm.model_params.use_extra_bufts),
    }


def _need(state: _State) -> Any:
    if state.llm is None:
        raise RuntimeError("no model is loaded in the llama.cpp worker")
    return state.llm


def _op_unload(state: _State) -> None:
    state.llm = None
    state.path = None
    state.decoded = False


def _op_tokenize(state: _State, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
    return list(_need(state).tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))


def _op_detokenize(state: _State, ids: list[int]) -> str:
    return _need(state).detokenize(ids).decode("utf-8", errors="replace")


def _op_eval_logits(state: _State, ids: list[int]) -> Any:
    import numpy as np  # child side: numpy stays out of the parent (the window starts without it)

    llm = _need(state)
    before_decode(state)
    llm.reset()
    llm.eval(list(ids))
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def _op_embed(state: _State, text: str) -> dict[str, Any]:
    import numpy as np  # child side: numpy stays out of the parent (the window starts without it)

    llm = _need(state)
    before_decode(state)
    ids = list(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
    emb = llm.embed(text, normalize=False)
    return {"ids": ids, "embeddings": np.asarray(emb, dtype=np.float32)}


def _op_chat(
    state: _State,
    messages: list[dict[str, str]],
    max_tokens: int = 16,
    temperature: float = 0.8,
    seed: int = 0,
) -> Any:
    llm = _need(state)
    before_decode(state)
    return llm.create_chat_completion(
        messages=messages, max_tokens=max_tokens, temperature=temperature, seed=seed
    )


def _op_chat_prompt(state: _State, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The prompt text llama-cpp-python renders from the file's chat template."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = _need(state)
    template = (llm.metadata or {}).get("tokenizer.chat_template")
    if not template:
        raise RuntimeError("the GGUF file has no chat template")
    eos_id, bos_id = llm.token_eos(), llm.token_bos()
    eos = llm._model.token_get_text(eos_id) if eos_id != -1 else ""
    bos = llm._model.token_get_text(bos_id) if bos_id != -1 else ""
    fmt = Jinja2ChatFormatter(
        template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt
    )
    return fmt(messages=messages).prompt


def _op_generate_stream(
    state: _State, prompt: str, max_tokens: int = 64, temperature: float = 0.8, seed: int = 0
) -> Iterator[Any]:
    llm = _need(state)
    before_decode(state)
    for chunk in llm.create_completion(
        prompt=prompt, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=True
    ):
        yield chunk["choices"][0]["text"]


def _op_quantize(
    state: _State,
    src: str,
    dst: str,
    ftype: int,
    overrides: list[tuple[str, str]] | None = None,
    imatrix: dict[str, Any] | None = None,
    nthread: int = 0,
    file_type: int | None = None,
    pure: bool = False,
    allow_requantize: bool = False,
) -> int:
    """llama_model_quantize with per-tensor regex overrides, an imatrix and a general.file_type;
    ``allow_requantize``: accept an already quantized source (llama-quantize --allow-requantize)."""
    import llama_cpp
    import numpy as np  # child side: numpy stays out of the parent (the window starts without it)

    from studio.core.ggml_types import ggml_type_id  # child side: its gguf-py stays out of the parent

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = int(nthread)
    params.ftype = int(ftype)
    params.pure = bool(pure)
    params.allow_requantize = bool(allow_requantize)
    keep: list[Any] = []  # keep ctypes buffers alive during the call
    if overrides:
        arr = (llama_cpp.llama_model_tensor_override * (len(overrides) + 1))()
        for i, (pat, qt) in enumerate(overrides):
            b = pat.encode("utf-8")
            keep.append(b)
            arr[i].pattern = b
            arr[i].type = ggml_type_id(qt)
        arr[len(overrides)].pattern = None
        params.tt_overrides = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
        keep.append(arr)
    if imatrix:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, vals) in enumerate(imatrix.items()):
            v = np.ascontiguousarray(vals, dtype=np.float32).reshape(-1)
            b = name.encode("utf-8")
            keep += [v, b]
            arr[i].name = b
            arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = v.size
        arr[len(imatrix)].name = None
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(arr)
    if file_type is not None:
        kv = (llama_cpp.llama_model_kv_override * 2)()
        kv[0].tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
        kv[0].key = b"general.file_type"
        kv[0].value.val_i64 = int(file_type)
        kv[1].key = b""
        params.kv_overrides = ctypes.cast(kv, ctypes.POINTER(llama_cpp.llama_model_kv_override))
        keep.append(kv)
    rc = llama_cpp.llama_model_quantize(src.encode("utf-8"), dst.encode("utf-8"), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed on {src} (code {rc})")
    return int(rc)


def _op_crash(state: _State, how: str = "segv") -> None:
    """Test hook: die the way llama.cpp does on a bad file."""
    os.kill(os.getpid(), signal.SIGSEGV if how == "segv" else signal.SIGABRT)


_OPS = {
    "ping": _op_ping,
    "system_info": _op_system_info,
    "load": _op_load,
    "unload": _op_unload,
    "tokenize": _op_tokenize,
    "detokenize": _op_detokenize,
    "eval_logits": _op_eval_logits,
    "embed": _op_embed,
    "chat": _op_chat,
    "chat_prompt": _op_chat_prompt,
    "generate_stream": _op_generate_stream,
    "quantize": _op_quantize,
    "crash": _op_crash,
}
