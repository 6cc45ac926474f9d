"""Tokenizer → GGUF: SentencePiece (llama), byte-level BPE (gpt2) and WordPiece (bert) vocabularies,
token types, merges, special tokens, add-bos/eos, the pre-tokenizer name and the chat template."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
from sentencepiece import SentencePieceProcessor
from tokenizers import Tokenizer

from studio.core import safejson
from studio.core.errors import ExportError
from studio.core.gguf.arch import gguf_arch, hparam
from studio.core.modelinfo import ModelInfo

# llama.cpp token types (llama_token_type / gguf.TokenType values).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Split regexes of known pre-tokenizers (as written in tokenizer.json) → tokenizer.ggml.pre name.
_LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_SPLIT_PRE = {_LLAMA3_RE: "llama-bpe", _QWEN2_RE: "qwen2", _QWEN35_RE: "qwen35", _GPT2_RE: "gpt-2"}


@dataclass(frozen=True)
class TokenizerSummary:
    """What was written: the GGUF tokenizer model, pre-tokenizer and vocabulary size."""

    model: str  # "llama", "gpt2", "bert"
    pre: str
    n_tokens: int
    has_chat_template: bool


def _looks_special(text: str) -> bool:
    # the converter's heuristic for added tokens that should be control tokens
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _read_json(path: Path) -> Any:
    try:
        return safejson.loads(path.read_text(encoding="utf-8"), f"{path.name} in {path.parent}", ExportError)
    except (OSError, ValueError) as err:
        raise ExportError(f"Cannot read {path}: {err}.") from err


def pre_tokenizer_name(tokenizer_json: dict[str, Any]) -> str:
    """The llama.cpp pre-tokenizer name for a tokenizer.json, by matching its pre-tokenizer.

    ExportError when it matches none we know: llama.cpp would split text differently.
    """
    pre = tokenizer_json.get("pre_tokenizer") or {}
    kind = pre.get("type")
    if kind == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    if kind == "Sequence":
        steps = pre.get("pretokenizers") or []
        splits = [s for s in steps if s.get("type") == "Split"]
        digits = [s for s in steps if s.get("type") == "Digits"]
        bytelevel = [s for s in steps if s.get("type") == "ByteLevel"]
        if len(splits) == 1 and not digits:
            pat = splits[0].get("pattern") or {}
            rx = pat.get("Regex") if isinstance(pat, dict) else None
            if rx in _SPLIT_PRE:
                return _SPLIT_PRE[rx]
        if digits and bytelevel and not splits and digits[0].get("individual_digits"):
            return "starcoder"
        if len(steps) == 1 and bytelevel and bytelevel[0].get("use_regex", True):
            return "gpt-2"
    raise ExportError(
        "The tokenizer's pre-tokenizer is not one llama.cpp knows (known: llama-bpe, qwen2, gpt-2, starcoder).",
        hint="The exported model would split text differently from the original; export is refused.",
    )


def add_tokenizer(w: Any, info: ModelInfo) -> TokenizerSummary:
    """Write the tokenizer of the model folder ``info.path`` into GGUF writer ``w``."""
    summary = _add_tokenizer(w, info)
    folder = info.path if info.path.is_dir() else info.path.parent
    add_normalizer_flags(w, folder / "tokenizer.json")
    return summary


def add_normalizer_flags(w: Any, tokenizer_json: Path) -> None:
    """``tokenizer.ggml.normalizer.{lowercase,strip_accents}`` from tokenizer.json's normalizer, as the
    gguf-py of llama.cpp's converter writes them (llama.cpp's WordPiece tokenizer reads them; the
    installed gguf-py predates them)."""
    if not tokenizer_json.is_file():
        return
    flags: dict[str, bool] = {}

    def walk(n: Any) -> None:
        if not isinstance(n, dict):
            return
        kind = n.get("type")
        if kind == "Lowercase":
            flags["lowercase"] = True
        elif kind == "StripAccents":
            flags["strip_accents"] = True
        elif kind == "BertNormalizer":
            for k in ("lowercase", "strip_accents"):
                if isinstance(n.get(k), bool):
                    flags[k] = n[k]
        elif kind == "Sequence":
            for m in n.get("normalizers") or []:
                walk(m)

    walk(_read_json(tokenizer_json).get("normalizer"))
    for k in ("lowercase", "strip_accents"):
        if k in flags:
            w.add_bool(f"tokenizer.ggml.normalizer.{k}", flags[k])


def _add_tokenizer(w: Any, info: ModelInfo) -> TokenizerSummary:
    folder = info.path if info.path.is_dir() else info.path.parent
    arch = gguf_arch(info)
    n_vocab = int(hparam(info.config, "vocab_size", default=0) or 0)
    tj_path = folder / "tokenizer.json"
    tj = _read_json(tj_path) if tj_path.is_file() else None
    model_type = ((tj or {}).get("model") or {}).get("type")
    if arch == "bert" or model_type == "WordPiece":
        tokens, types = _hf_vocab(folder, n_vocab)
        # llama.cpp's WPM tokenizer works on "phantom space" pieces: ▁word, and ## dropped
        tokens = [
            t if ty == CONTROL else (t[2:] if t.startswith("##") else "\u2581" + t)
            for t, ty in zip(tokens, types, strict=True)
        ]
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_type_count(int(info.config.get("type_vocab_size", 1)))
        has_ct = write_special_vocab(w, _special_vocab(folder, len(tokens), merges=False))
        return TokenizerSummary("bert", "default", len(tokens), has_ct)
    if (folder / "tokenizer.model").is_file() and arch in ("llama", "gemma", "gemma2", "phi3"):
        tokens_b, scores, types = _spm_vocab(folder, n_vocab)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens_b)
        w.add_token_scores(scores)
        w.add_token_types(types)
        if arch in ("gemma", "gemma2"):
            w.add_add_space_prefix(False)
        else:
            tc = folder / "tokenizer_config.json"
            if tc.is_file():
                aps = _read_json(tc).get("add_prefix_space")
                if aps is not None:
                    w.add_add_space_prefix(bool(aps))
        has_ct = write_special_vocab(w, _special_vocab(folder, len(tokens_b), merges=False))
        return TokenizerSummary("llama", "default", len(tokens_b), has_ct)
    if tj is None:
        raise ExportError(
            f"{folder} has neither tokenizer.model nor tokenizer.json; cannot export its tokenizer."
        )
    byte_fallback = bool((tj.get("model") or {}).get("byte_fallback"))
    if model_type == "BPE" and byte_fallback and arch in ("llama", "gemma", "gemma2", "phi3"):
        # a SentencePiece-style BPE saved only as tokenizer.json: llama.cpp's "llama" (SPM) tokenizer
        return _llama_hf_vocab(w, folder, arch)
    if model_type != "BPE":
        raise ExportError(
            f"The tokenizer model {model_type!r} in {tj_path} is not supported for GGUF export."
        )
    pre = pre_tokenizer_name(tj)
    tokens, types = _hf_vocab(folder, n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    has_ct = write_special_vocab(w, _special_vocab(folder, len(tokens), merges=True))
    return TokenizerSummary("gpt2", pre, len(tokens), has_ct)


def _llama_hf_vocab(w: Any, folder: Path, arch: str) -> TokenizerSummary:
    log = logging.getLogger("gguf")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        vocab = gguf.LlamaHfVocab(folder)
        tokens, scores, types = [], [], []
        for text, score, toktype in vocab.all_tokens():
            tokens.append(text)
            scores.append(score)
            types.append(int(toktype))
    except Exception as err:
        raise ExportError(f"Cannot convert the tokenizer in {folder}: {err}.") from None
    finally:
        log.setLevel(old)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    if arch in ("gemma", "gemma2"):
        w.add_add_space_prefix(False)
    has_ct = write_special_vocab(w, _special_vocab(folder, len(tokens), merges=False))
    return TokenizerSummary("llama", "default", len(tokens), has_ct)


def _special_vocab(folder: Path, n_vocab: int, *, merges: bool) -> Any:
    """Special token ids, add_bos/add_eos, merges and the chat template via gguf-py."""
    # gguf-py logs at INFO/WARNING; keep it out of the user's terminal unless they ask for logs
    log = logging.getLogger("gguf")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        sv = gguf.SpecialVocab(folder, load_merges=merges, n_vocab=n_vocab)
    finally:
        log.setLevel(old)
    if sv.chat_template is None:
        sv.chat_template = _chat_template(folder)
    bos, eos = _hf_adds_special(folder)
    # what the HF tokenizer really does wins over config flags (transformers 5 writes none)
    if bos is not None:
        sv.add_special_token["bos"] = bos
    if eos is not None:
        sv.add_special_token["eos"] = eos
    return sv


def _fast_tokenizer(folder: Path) -> Any:
    """The HF fast tokenizer of ``folder`` through the tokenizers library (no torch import), or
    transformers' AutoTokenizer when there is no tokenizer.json."""
    tj = folder / "tokenizer.json"
    if tj.is_file():
        return Tokenizer.from_file(str(tj))
    return None


def _token_id(folder: Path, tok: Any, key: str) -> int | None:
    tc = folder / "tokenizer_config.json"
    text = _read_json(tc).get(key) if tc.is_file() else None
    if isinstance(text, dict):
        text = text.get("content")
    if not isinstance(text, str):
        return None
    return tok.token_to_id(text)


def _hf_adds_special(folder: Path) -> tuple[bool | None, bool | None]:
    """Whether the HF tokenizer prepends BOS / appends EOS, found by encoding a probe text."""
    tok = _fast_tokenizer(folder)
    if tok is None:
        return None, None
    with_sp = list(tok.encode("a b", add_special_tokens=True).ids)
    plain = list(tok.encode("a b", add_special_tokens=False).ids)
    bos_id, eos_id = _token_id(folder, tok, "bos_token"), _token_id(folder, tok, "eos_token")
    bos = None
    if bos_id is not None:
        bos = bool(with_sp) and with_sp[0] == bos_id and (not plain or plain[0] != bos_id)
    eos = None
    if eos_id is not None:
        eos = bool(with_sp) and with_sp[-1] == eos_id and (not plain or plain[-1] != eos_id)
    return bos, eos


def _chat_template(folder: Path) -> str | None:
    for name in ("chat_template.jinja",):
        p = folder / name
        if p.is_file():
            return p.read_text(encoding="utf-8")
    cj = folder / "chat_template.json"
    if cj.is_file():
        t = _read_json(cj).get("chat_template")
        if isinstance(t, str):
            return t
    return None


def write_special_vocab(w: Any, sv: Any) -> bool:
    """Add a SpecialVocab's keys to ``w``; True when a chat template was written."""
    log = logging.getLogger("gguf")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        sv.add_to_gguf(
            w, quiet=True
        ) if "quiet" in gguf.SpecialVocab.add_to_gguf.__code__.co_varnames else sv.add_to_gguf(w)
    finally:
        log.setLevel(old)
    return sv.chat_template is not None


def _spm_vocab(folder: Path, n_vocab: int) -> tuple[list[bytes], list[float], list[int]]:
    """Tokens, scores and types of a SentencePiece model plus the HF added tokens (as the converter)."""
    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(folder / "tokenizer.model"))
    size = n_vocab or sp.vocab_size()
    tokens = [f"[PAD{i}]".encode() for i in range(size)]
    scores = [-10000.0] * size
    types = [UNUSED] * size
    for i in range(min(sp.vocab_size(), size)):
        t = NORMAL
        if sp.IsUnknown(i):
            t = UNKNOWN
        elif sp.IsControl(i):
            t = CONTROL
        elif sp.IsUnused(i):
            t = UNUSED
        elif sp.IsByte(i):
            t = BYTE
        tokens[i] = sp.IdToPiece(i).encode("utf-8")
        scores[i] = float(sp.GetScore(i))
        types[i] = t
    added = folder / "added_tokens.json"
    if added.is_file():
        for text, tid in _read_json(added).items():
            if 0 <= int(tid) < size:
                tokens[int(tid)] = text.encode("utf-8")
                scores[int(tid)] = -1000.0
                types[int(tid)] = USER_DEFINED
    for tid, text, special in _added_tokens(folder):
        if not 0 <= tid < size:
            continue
        if special or _looks_special(text):
            types[tid] = CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[tid] = USER_DEFINED
        scores[tid] = -1000.0
        tokens[tid] = text.encode("utf-8")
    return tokens, scores, types


def _added_tokens(folder: Path) -> list[tuple[int, str, bool]]:
    """(id, text, special) of added tokens from tokenizer_config.json or tokenizer.json."""
    out: dict[int, tuple[int, str, bool]] = {}
    tj = folder / "tokenizer.json"
    if tj.is_file():
        for a in _read_json(tj).get("added_tokens") or []:
            out[int(a["id"])] = (int(a["id"]), str(a["content"]), bool(a.get("special")))
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        for k, a in (_read_json(tc).get("added_tokens_decoder") or {}).items():
            out[int(k)] = (int(k), str(a["content"]), bool(a.get("special")))
    return [out[k] for k in sorted(out)]


def _hf_vocab(folder: Path, n_vocab: int) -> tuple[list[str], list[int]]:
    """Tokens and types of a HF (fast) tokenizer, padded to the model's vocab size."""
    tok = _fast_tokenizer(folder)
    if tok is not None:
        vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    else:
        from transformers import AutoTokenizer  # vocab.txt-only tokenizers (old BERT folders)

        vocab = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False).get_vocab()
    if not vocab:
        raise ExportError(f"The tokenizer in {folder} has an empty vocabulary.")
    top = max(vocab.values())
    if n_vocab and top >= n_vocab:
        raise ExportError(
            f"The tokenizer in {folder} has token id {top}, beyond the model's vocab_size {n_vocab}."
        )
    size = max(n_vocab, top + 1)
    rev = {i: t for t, i in vocab.items()}
    added = {i: (text, special) for i, text, special in _added_tokens(folder)}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(size):
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        t = rev[i]
        if i in added:
            if added[i][1] or _looks_special(t):
                types.append(CONTROL)
            else:
                t = t.replace("\u2581", " ")
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(t)
    return tokens, types
