"""The tiny-model factory's tokenizers: real offline tokenizers (SentencePiece, BPE, WordPiece) trained on the
shipped multilingual sample text, with each family's chat template."""

from __future__ import annotations

import collections
import functools
import inspect
import io
import json
from pathlib import Path
from typing import Any

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from studio.core.factory.specs import FactoryError, _spec
from studio.paths import resource_path

TEXT_PATH = resource_path("text", "multilingual.txt")
"""The multilingual sample text the tokenizers are trained on."""


# Qwen2's pre-tokenizer regex, as in its tokenizer.json: splits letters, single digits, punctuation, newlines.
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


ZEPHYR_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)


MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- else %}{{- '[INST] ' + message['content'] + ' [/INST] Understood.' + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)


GEMMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{- '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)


PHI3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- else %}{{- eos_token }}{%- endif %}"
)


def sample_text() -> str:
    """The multilingual sample text shipped in resources/text (English, German, French, CJK, code, emoji)."""
    try:
        return TEXT_PATH.read_text(encoding="utf-8")
    except OSError as exc:
        raise FactoryError(
            f"The sample text {TEXT_PATH} could not be read ({exc.strerror}).",
            hint="Reinstall Quant Studio so that its resources folder is present.",
        ) from exc


def _text_lines() -> list[str]:
    return [line for line in sample_text().splitlines() if line.strip()]


@functools.lru_cache(maxsize=16)
def _train_spm(flavour: str, vocab_size: int) -> bytes:
    """Train a SentencePiece BPE model with byte fallback; returns the serialized tokenizer.model.

    Cached per process because every test model of the same flavour shares it.
    """
    ids: dict[str, int | str] = {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}
    user_symbols: list[str] = []
    add_dummy_prefix = True
    if flavour == "spm-gemma":
        # Gemma: <pad>=0, <eos>=1, <bos>=2, <unk>=3, no dummy prefix, turn markers in the vocabulary.
        ids = {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3, "pad_piece": "<pad>", "eos_piece": "<eos>"}
        ids["bos_piece"] = "<bos>"
        user_symbols = ["<mask>", "<start_of_turn>", "<end_of_turn>"]
        add_dummy_prefix = False
    buf = io.BytesIO()
    lines = _text_lines()
    # SentencePiece's BPE trainer accepts no coverage below 0.98; with the CJK part of the sample text
    # that puts the smallest vocabulary at about 720 pieces (256 of them bytes).
    coverage = max(0.98, _char_coverage(lines, vocab_size - 256 - 8 - len(user_symbols) - 64))
    trainer_args: dict[str, Any] = dict(
        sentence_iterator=iter(lines),
        model_writer=buf,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        byte_fallback=True,
        character_coverage=coverage,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        split_digits=True,
        # Whitespace-only pieces make SentencePiece and the tokenizers BPE split runs of spaces differently.
        allow_whitespace_only_pieces=False,
        user_defined_symbols=user_symbols,
        num_threads=1,  # deterministic
        shuffle_input_sentence=False,
        max_sentence_length=1 << 16,
        minloglevel=2,
        **ids,
    )
    try:
        spm.SentencePieceTrainer.train(**trainer_args)
    except RuntimeError as exc:
        raise FactoryError(
            f"A SentencePiece vocabulary of {vocab_size} pieces cannot hold the sample text's characters.",
            hint="Use a vocab_size of 768 or more (1024 is the default).",
        ) from exc
    return buf.getvalue()


def _char_coverage(lines: list[str], room: int) -> float:
    """The SentencePiece character_coverage that keeps at most ``room`` distinct characters.

    Rarer characters are left to the byte-fallback pieces; SentencePiece refuses to train when the
    kept characters alone exceed the vocabulary.
    """
    counts = collections.Counter(ch for line in lines for ch in line)
    if len(counts) <= room:
        return 1.0
    if room < 1:
        return 0.98
    freq = sorted(counts.values(), reverse=True)
    kept = sum(freq[:room])
    # Halfway between the last kept and the first dropped character, to stay clear of rounding.
    return (kept - freq[room - 1] / 2) / sum(freq)


@functools.lru_cache(maxsize=16)
def _train_bpe(flavour: str, vocab_size: int) -> str:
    """Train a byte-level BPE (Qwen2 or GPT-2 pre-tokenization); returns the tokenizer JSON."""
    tok = Tokenizer(models.BPE())
    if flavour == "bpe-qwen":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([line + "\n" for line in _text_lines()], trainer=trainer)
    return tok.to_str()


@functools.lru_cache(maxsize=16)
def _train_wordpiece(vocab_size: int) -> str:
    """Train a BERT WordPiece vocabulary; returns the tokenizer JSON."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    )
    tok.train_from_iterator(_text_lines(), trainer=trainer)
    return tok.to_str()


def _spm_vocab_and_merges(model_bytes: bytes) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary (piece -> id) and BPE merges of a SentencePiece BPE model, without protobuf.

    A merge (left, right) is ranked by the id of the piece it makes, which is how SentencePiece
    orders BPE pieces (score = -id), so the tokenizers BPE gives the same ids.
    """
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    mergeable = {
        piece: i
        for piece, i in vocab.items()
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i))
    }
    ranked: list[tuple[int, int, int, str, str]] = []
    for piece, pid in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((pid, mergeable[left], mergeable[right], left, right))
    ranked.sort()
    return vocab, [(left, right) for _, _, _, left, right in ranked]


def _special_ids(tok: Any) -> dict[str, int | None]:
    return {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }


def _add_specials(tok: Any, extra: list[str], **named: str) -> None:
    """Append special tokens after the learned vocabulary (transformers 5 calls them "extra", 4 "additional")."""
    # Add in the given order first: add_special_tokens would add named tokens (eos, pad) before the rest.
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in extra], special_tokens=True)
    params = inspect.signature(tok.add_special_tokens).parameters
    if "replace_extra_special_tokens" in params:
        tok.add_special_tokens({"extra_special_tokens": extra, **named}, replace_extra_special_tokens=False)
    else:
        tok.add_special_tokens(
            {"additional_special_tokens": extra, **named}, replace_additional_special_tokens=False
        )


def build_tokenizer(arch: str, vocab_size: int | None = None) -> tuple[Any, bytes | None, str | None]:
    """Build the offline tokenizer of ``arch``: (transformers tokenizer, tokenizer.model bytes or None, chat template)."""
    spec = _spec(arch)
    kind = spec.tokenizer
    if kind.startswith("spm"):
        size = vocab_size or 1024
        model_bytes = _train_spm("spm-gemma" if kind == "spm-gemma" else "spm", size)
        vocab, merges = _spm_vocab_and_merges(model_bytes)
        if kind == "spm-gemma":
            from transformers import GemmaTokenizer

            tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False)
            _add_specials(tok, ["<start_of_turn>", "<end_of_turn>"])
            return tok, model_bytes, GEMMA_TEMPLATE
        from transformers import LlamaTokenizer

        if kind == "spm-phi3":
            # Phi-3 keeps Llama's SentencePiece model and appends its chat markers after it.
            tok = LlamaTokenizer(
                vocab=vocab, merges=merges, add_bos_token=False, legacy=False, add_prefix_space=True
            )
            extra = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
            _add_specials(tok, extra, pad_token="<|endoftext|>", eos_token="<|end|>")
            return tok, model_bytes, PHI3_TEMPLATE
        tok = LlamaTokenizer(
            vocab=vocab, merges=merges, add_bos_token=True, legacy=False, add_prefix_space=True
        )
        return tok, model_bytes, (MISTRAL_TEMPLATE if arch in ("mistral", "mixtral") else ZEPHYR_TEMPLATE)

    if kind.startswith("bpe"):
        size = vocab_size or 1024
        data = json.loads(_train_bpe(kind, size))  # noqa: TID251 - the factory's own tokenizer files, made in this module
        vocab = data["model"]["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data["model"]["merges"]]
        if kind == "bpe-qwen":
            from transformers import Qwen2Tokenizer

            # Qwen's order: <|endoftext|>, <|im_start|>, <|im_end|> right after the learned vocabulary, as
            # added tokens only (not in the BPE vocab), as in Qwen's own tokenizer.json. The constructor
            # adds its eos first, so it starts with <|endoftext|> and eos moves to <|im_end|> afterwards.
            specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            tok = Qwen2Tokenizer(
                vocab=vocab,
                merges=merges,
                eos_token="<|endoftext|>",
                pad_token="<|endoftext|>",
                unk_token=None,
                bos_token=None,
            )
            _add_specials(tok, specials, eos_token="<|im_end|>")
            return tok, None, CHATML_TEMPLATE
        from transformers import GPT2Tokenizer

        tok = GPT2Tokenizer(vocab=vocab, merges=merges)
        tok.add_special_tokens({"eos_token": "<|endoftext|>"})
        return tok, None, None

    from transformers import BertTokenizer

    data = json.loads(_train_wordpiece(vocab_size or 1024))  # noqa: TID251 - the factory's own tokenizer files, made in this module
    tok = BertTokenizer(vocab=dict(data["model"]["vocab"]), do_lower_case=True)
    return tok, None, None


def _save_tokenizer(tok: Any, folder: Path, spm_bytes: bytes | None, template: str | None) -> None:
    tok.save_pretrained(str(folder))
    if spm_bytes is not None:
        # llama.cpp's converter and SentencePiece users read this file; keep it next to tokenizer.json.
        (folder / "tokenizer.model").write_bytes(spm_bytes)

        base = spm.SentencePieceProcessor(model_proto=spm_bytes).get_piece_size()
        added = {t: i for t, i in sorted(tok.get_added_vocab().items(), key=lambda kv: kv[1]) if i >= base}
        if added:
            # Tokens past the SentencePiece model (Phi-3's chat markers) are listed here too, as in
            # the real repositories, for readers of tokenizer.model such as gguf's SentencePieceVocab.
            (folder / "added_tokens.json").write_text(json.dumps(added, indent=2) + "\n", encoding="utf-8")
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))  # noqa: TID251 - the factory's own tokenizer files, made in this module
    cfg.pop("chat_template", None)
    if template is not None:
        # In tokenizer_config.json, where both older and newer readers (and GGUF exporters) look.
        cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
