"""The llama.cpp child's log filter: errors reach stderr, warnings and info do not."""

from __future__ import annotations


def test_log_filter_passes_errors_and_their_continuations_only(capsys):
    from studio.core.llamacpp.worker import _log_filter

    cb = _log_filter()
    # ggml.h levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous message
    cb(3, b"llama_tensor_get_type: applying manual override\n", None)
    cb(2, b"loading model\n", None)
    cb(4, b"failed to load", None)
    cb(5, b" model.gguf\n", None)
    cb(3, b"a warning", None)
    cb(5, b" continued\n", None)
    assert capsys.readouterr().err == "failed to load model.gguf\n"
