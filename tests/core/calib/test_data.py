"""Calibration data: files, chats through the model's template, the built-in text, llama-imatrix's chunking."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studio.core.calib.calibrate import load_tokenizer, prepare_input
from studio.core.calib.data import (
    BUILTIN,
    CalibrationText,
    ChatFormat,
    builtin_pieces,
    calibration_sources,
    chunk_ids,
    interleave,
    load_calibration,
    load_text_file,
    make_chunks,
    mix,
    read_chats,
    tokenize,
)
from studio.core.errors import CalibrationError


def _one_sentence(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_chunks_follow_llama_imatrix():
    ids = list(range(100, 100 + 1000))
    ch = make_chunks(ids, 128, None, bos=1, dataset="t")
    assert ch.tokens.shape == (7, 128)  # 1000 // 128 whole chunks, the partial one dropped
    assert (ch.tokens[:, 0] == 1).all()  # BOS first in every chunk
    assert ch.tokens[1, 1] == 100 + 128 + 1  # the rest of each chunk is the text, in order
    assert ch.n_tokens == 7 * 128 and ch.n_text_tokens == 1000
    no_bos = make_chunks(ids, 128, 3, bos=None, dataset="t")
    assert no_bos.tokens.shape == (3, 128) and no_bos.tokens[2, 0] == 100 + 256


@pytest.mark.parametrize(
    ("n_tokens", "n_ctx", "chunks", "needle"),
    [
        (200, 128, None, "at least 256"),  # llama-imatrix wants two chunks' worth
        (1000, 128, 9, "holds 7 chunks"),  # more than the text holds: refused, not clamped
        (1000, 128, 0, "At least one chunk"),
        (1000, 8, None, "too small"),
    ],
)
def test_chunking_refuses_bad_requests(n_tokens, n_ctx, chunks, needle):
    with pytest.raises(CalibrationError) as exc:
        make_chunks(list(range(n_tokens)), n_ctx, chunks, bos=None, dataset="text.txt")
    assert needle in _one_sentence(exc.value)


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"", "is empty"), (b"  \n\t\n", "is empty"), (b"caf\xe9 au lait " * 10, "not UTF-8")],
    ids=["empty", "blank", "latin1"],
)
def test_bad_text_files(tmp_path, content, needle):
    p = tmp_path / "calib.txt"
    p.write_bytes(content)
    with pytest.raises(CalibrationError) as exc:
        load_text_file(p)
    assert needle in _one_sentence(exc.value) and "calib.txt" in str(exc.value)
    with pytest.raises(CalibrationError, match="cannot be read|not a file"):
        load_text_file(tmp_path / "missing.txt")


def test_read_chats(tmp_path):
    p = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        [{"role": "user", "content": "bare list"}],
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    chats = read_chats(p)
    assert [len(c) for c in chats] == [2, 1] and chats[1][0]["content"] == "bare list"
    p.write_text('{"messages": [{"role": "user"}]}\n', encoding="utf-8")
    with pytest.raises(CalibrationError, match="Line 1 .* without string"):
        read_chats(p)
    p.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match="Line 1 .* not valid JSON"):
        read_chats(p)


def test_interleave_mixes_kinds():
    assert interleave([["p1", "p2", "p3"], ["d1"], ["c1", "c2"]]) == ["p1", "d1", "c1", "p2", "c2", "p3"]


def test_builtin_text_renders_chats_through_the_models_template(qwen2_model):
    tok = load_tokenizer(qwen2_model)
    pieces = builtin_pieces(ChatFormat.of_tokenizer(tok))
    assert set(pieces) == {"prose", "dialogues", "code", "languages"}
    assert all(len(v) >= 10 for v in pieces.values())
    assert all(d.startswith("<|im_start|>") for d in pieces["dialogues"])  # ChatML of the tiny Qwen2
    inp = prepare_input(qwen2_model, BUILTIN, n_ctx=64, tokenizer=tok)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert im_start in inp.chunks.tokens  # rendered chats: special tokens are parsed
    # the first chunks already mix kinds: chat markup and code both appear within the first third
    head = inp.data.text[: len(inp.data.text) // 3]
    assert "<|im_start|>assistant" in head and "def " in head and "der" in head


def test_plain_text_keeps_special_token_text_as_text(qwen2_model):
    tok = load_tokenizer(qwen2_model)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    text = "plain words <|im_start|>user more words"
    assert im_start not in tokenize(tok, CalibrationText("file.txt", text))  # llama-imatrix's default
    assert im_start in tokenize(tok, CalibrationText("chat.jsonl", text, parse_special=True))


def test_prepare_input_on_a_text_file(llama_model, calib_text):
    inp = prepare_input(llama_model, calib_text, n_ctx=64, n_chunks=3)
    assert inp.chunks.tokens.shape == (3, 64) and inp.chunks.tokens.dtype == np.int64
    assert inp.chunks.bos == 1 and (inp.chunks.tokens[:, 0] == 1).all()
    assert inp.chunks.dataset == str(calib_text)


def test_a_mix_tokenizes_each_part_as_it_would_be_alone(qwen2_model, tmp_path):
    tok = load_tokenizer(qwen2_model)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    own = tmp_path / "mine.txt"
    own.write_text("plain words <|im_start|>user more words " * 50, encoding="utf-8")
    fmt = ChatFormat.of_tokenizer(tok)
    m = load_calibration([own, BUILTIN], fmt)
    plain, chats = m.parts
    assert plain.name == str(own) and not plain.parse_special and chats.parse_special
    ids = tokenize(tok, m)
    # the user's plain text keeps its special-token text as text; the built-in chats have theirs parsed
    assert ids == tokenize(tok, plain) + tokenize(tok, chats)
    assert im_start not in ids[: len(tokenize(tok, plain))] and im_start in ids
    assert m.name == f"{own} + quant-studio built-in calibration text"
    # a mix of one is that text; mixes flatten; the digest tells where the parts meet
    assert mix([plain]) is plain and mix([m, plain]).parts == (plain, chats, plain)
    joined = CalibrationText("x", m.text, parse_special=True)
    assert joined.digest != m.digest


def test_a_mix_drops_the_bos_a_later_part_would_start_with(llama_model, tmp_path):
    tok = load_tokenizer(llama_model)  # the tiny Llama puts BOS in front of plain text
    a, b = CalibrationText("a.txt", "first part " * 20), CalibrationText("b.txt", "second part " * 20)
    ids_a, ids_b = tokenize(tok, a), tokenize(tok, b)
    assert ids_a[0] == ids_b[0] == 1
    assert tokenize(tok, mix([a, b])) == ids_a + ids_b[1:]


def test_best_calibrates_on_the_users_text_then_the_builtin_one():
    assert calibration_sources("mine.txt", "awq+gptq") == ["mine.txt", BUILTIN]
    assert calibration_sources("mine.txt", "awq+gptq", own_only=True) == "mine.txt"
    assert calibration_sources("mine.txt", "gptq") == ["mine.txt", BUILTIN]  # GPTQ fits what it is shown
    assert calibration_sources("mine.txt", "gptq", own_only=True) == "mine.txt"
    assert calibration_sources("mine.txt", "imatrix") == "mine.txt"  # the plan gained nothing from the mix
    assert calibration_sources(None, "awq+gptq") == BUILTIN
    assert calibration_sources(BUILTIN, "awq+gptq") == BUILTIN


def test_the_first_chunks_of_a_mix_are_already_a_mix(llama_model):
    tok = load_tokenizer(llama_model)
    a = CalibrationText("a.txt", "alpha beta gamma. " * 400)
    b = CalibrationText("b.txt", "one two three. " * 100)
    m = mix([a, b])
    n_a, n_b = ((len(tokenize(tok, t)) - 1) // 64 for t in (a, b))
    inp = prepare_input(llama_model, m, n_ctx=64, tokenizer=tok)
    assert inp.chunks.n_chunks == n_a + n_b and n_a > 2 * n_b > 0  # each part's whole chunks, BOS dropped
    only_b = set(tokenize(tok, b)) - set(tokenize(tok, a))
    assert only_b
    from_b = [bool(only_b & set(c[1:].tolist())) for c in inp.chunks.tokens]
    assert sum(from_b) == n_b and (inp.chunks.tokens[:, 0] == 1).all()
    # in proportion: b's chunks spread through the sequence, one of them within the first few
    assert from_b.index(True) <= (n_a + n_b) // n_b
    assert chunk_ids(tok, a, 64) == tokenize(tok, a)  # a single text is cut as before
