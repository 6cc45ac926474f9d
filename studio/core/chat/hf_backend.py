"""The original checkpoint through transformers, with our own generation loop (so Stop acts per token).

The loop feeds the KV cache one token at a time and passes the raw float32 logits to the shared
sampler, exactly as the llama.cpp child does. Token text comes from each token's bytes (the way
llama.cpp's ``token_to_piece`` makes it), joined by an incremental UTF-8 decoder, so a model and its
GGUF export print the same text for the same tokens.
"""

from __future__ import annotations

import codecs
import inspect
import re
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

from studio.core import hardware, safejson
from studio.core.chat.backend import BaseBackend, StopCheck
from studio.core.chat.sampling import choose, make_rng
from studio.core.chat.types import ChatError, Sampling, StopReason, TokenEvent
from studio.core.errors import ModelOpenError, RemoteCodeError
from studio.core.jobs import JobContext
from studio.core.model.hf_folder import transformers_folder
from studio.core.model.hf_progress import no_hf_progress_bars
from studio.core.plan.job_estimate import estimate_whole
from studio.core.units import format_bytes

DTYPES = ("auto", "float32", "float16", "bfloat16")
PROMPT_BATCH = 256
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def resolve_device(device: str = "auto") -> str:
    """``auto`` → cuda, then mps, then cpu; other names are checked for availability."""
    import torch

    device = (device or "auto").lower()
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ChatError("CUDA was chosen but no CUDA device is available.", hint="Choose cpu.")
    if device == "mps" and not (
        getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    ):
        raise ChatError("MPS was chosen but Metal is not available here.", hint="Choose cpu.")
    if not (device == "cpu" or device.startswith("cuda") or device == "mps"):
        raise ChatError(f"Unknown device {device!r}; use auto, cpu, cuda or mps.")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    """The torch dtype: float32 on CPU for ``auto``, bfloat16 (or float16) on a GPU."""
    import torch

    if dtype not in DTYPES:
        raise ChatError(f"Unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    if dtype == "auto":
        if device == "cpu":
            return torch.float32
        if device.startswith("cuda") and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float16
    return getattr(torch, dtype)


def _decoder_kinds(node: Any) -> list[dict[str, Any]]:
    if not isinstance(node, dict):
        return []
    out = [node]
    for child in node.get("decoders") or ():
        out.extend(_decoder_kinds(child))
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to chars from U+0100."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def token_bytes_table(tok: Any) -> list[bytes] | None:
    """Each token id's bytes as llama.cpp would print it, or None for tokenizers we cannot map.

    Special tokens print as nothing; SentencePiece ``▁`` is a space and ``<0xNN>`` one raw byte;
    byte-level BPE characters map back through GPT-2's byte table.
    """
    try:
        spec = safejson.loads(tok.backend_tokenizer.to_str(), "tokenizer", ValueError)
    except Exception:  # noqa: BLE001 - slow tokenizers have no backend JSON
        return None
    decs = _decoder_kinds(spec.get("decoder"))
    types = {d.get("type") for d in decs}
    if "ByteLevel" in types:
        mode = "bytelevel"
    elif "Metaspace" in types or any(
        d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == "\u2581" for d in decs
    ):
        mode = "spm"
    else:
        return None
    byte_decoder: dict[str, int] = {}
    if mode == "bytelevel":
        byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}
    n = len(tok)
    pieces = tok.convert_ids_to_tokens(list(range(n)))
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    special = set(getattr(tok, "all_special_ids", []) or [])
    special |= {i for i, t in added.items() if getattr(t, "special", False)}
    table: list[bytes] = []
    for i, s in enumerate(pieces):
        if i in special or s is None:
            table.append(b"")
        elif i in added:
            table.append(str(getattr(added[i], "content", s)).encode("utf-8"))
        elif mode == "spm":
            m = _BYTE_TOKEN.match(s)
            table.append(bytes([int(m.group(1), 16)]) if m else s.replace("\u2581", " ").encode("utf-8"))
        else:
            try:
                table.append(bytes(byte_decoder[c] for c in s))
            except KeyError:
                table.append(s.encode("utf-8"))
    return table


def check_fits_whole(cfg: dict[str, Any], label: str, device: str, dtype: Any) -> None:
    """Refuse (ChatError, one sentence) loading a checkpoint whose weights in ``dtype`` need more host
    memory than is free: an 8B in float32 is 33.6 GB, and the window's chat column began loading it as soon
    as it was opened (minutes of reading, then the kernel's out-of-memory kill)."""
    if device != "cpu" or not cfg:
        return
    nbytes = 2 if str(dtype) in ("torch.bfloat16", "torch.float16") else 4
    est = estimate_whole(cfg, 512, dtype_bytes=nbytes, device=device)
    free = hardware.ram()[1]
    if free > 0 and est.peak_bytes > free:
        raise ChatError(
            f"{label} needs about {format_bytes(est.peak_bytes)} in transformers ({str(dtype).replace('torch.', '')}), "
            f"more than the {format_bytes(free)} free: chat with a GGUF export of it, which llama.cpp maps from "
            "disk" + (", or choose bfloat16" if nbytes == 4 else "") + "."
        )


def check_folder(folder: Path) -> dict[str, Any]:
    """The folder's config.json, after the checks every transformers load makes first (a folder
    with config.json, no custom code); one ``ModelOpenError``/``RemoteCodeError`` sentence otherwise."""
    cfg_path = folder / "config.json"
    if not folder.exists():
        raise ModelOpenError(f"{folder} does not exist.", hint="Check the path of the model.")
    if not folder.is_dir():
        raise ModelOpenError(
            f"{folder} is neither a GGUF file (.gguf) nor a Hugging Face model folder.",
            hint="Choose a .gguf file or a folder with config.json.",
        )
    if not cfg_path.is_file():
        raise ModelOpenError(f"{folder} has no config.json, so transformers cannot load it.")
    try:
        cfg = safejson.loads(cfg_path.read_bytes(), "config.json", ValueError)
    except (OSError, ValueError) as err:
        raise ModelOpenError(f"The config.json of {folder} cannot be read ({err}).") from None
    if isinstance(cfg, dict) and cfg.get("auto_map"):
        raise RemoteCodeError(
            f"{folder} needs custom Python code from its repository, which Quant Studio does not run.",
            hint="Use a model supported by transformers itself.",
        )
    return cfg if isinstance(cfg, dict) else {}


class TransformersBackend(BaseBackend):
    """The original Hugging Face checkpoint on CUDA, MPS or CPU, in float32, float16 or bfloat16."""

    kind = "transformers"

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        n_ctx: int = 2048,
        label: str | None = None,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__(path, n_ctx=n_ctx, label=label)
        self.allow_pickle = allow_pickle  # a pickle-only folder: refused, or converted in a child process
        self.device_request = device
        self.dtype_request = dtype
        self.device = ""
        self.dtype = ""
        self._model: Any = None
        self._tok: Any = None
        self._table: list[bytes] | None = None
        self._eos: set[int] = set()
        self._vocab: tuple[str, ...] | None = None
        self._cache_name: str | None = None
        self.n_threads: int | None = None  # the column's share of the cores (None: torch's choice)
        self.threads_used: int | None = None  # torch's thread count of the last generation's thread

    def set_threads(self, n: int | None) -> None:
        """Record the column's share of the cores; torch's count is process-wide, so the face that owns
        the process sets it (``studio.core.chat.threads.torch_threads``), never the core."""
        self.n_threads = int(n) if n else None

    def load(self, ctx: JobContext | None = None) -> None:
        """Load tokenizer and model (never running code from the model's folder)."""
        if self._loaded:
            return
        folder = self.path
        cfg = check_folder(folder)
        # never from_pretrained on pickle weights here: refused, or their safetensors conversion
        weights = transformers_folder(folder, allow_pickle=self.allow_pickle, ctx=ctx)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(self.device_request)
        dtype = resolve_dtype(self.dtype_request, device)
        check_fits_whole(cfg, self.label, device, dtype)
        if ctx is not None:
            ctx.check_cancelled()
        try:
            tok = AutoTokenizer.from_pretrained(str(weights), trust_remote_code=False)
            kw: dict[str, Any] = {"attn_implementation": "eager"} if cfg.get("model_type") == "gemma2" else {}
            with no_hf_progress_bars():  # its "Loading weights" bar garbled the CLI's progress line
                model = AutoModelForCausalLM.from_pretrained(
                    str(weights), dtype=dtype, trust_remote_code=False, **kw
                )
        except Exception as err:  # noqa: BLE001 - one sentence for the user, whatever transformers raised
            raise ModelOpenError(f"transformers could not load {folder}: {_first_line(err)}") from err
        try:
            model = model.to(device)
        except torch.OutOfMemoryError:
            # the GPU is too small for the original model, the CPU still works
            # (tests/core/chat/test_backends.py::test_original_too_big_for_the_gpu_runs_on_the_cpu)
            self._notes.append(f"{self.label} did not fit on {device}; it runs on the CPU instead.")
            device, dtype = "cpu", torch.float32
            model = model.to(device=device, dtype=dtype)
        model.eval()
        self._model, self._tok = model, tok
        self.device, self.dtype = device, str(dtype).replace("torch.", "")
        template = getattr(tok, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default") or next(iter(template.values()), None)
        self.template = template if isinstance(template, str) else None
        self.bos_token = str(tok.bos_token or "")
        self.eos_token = str(tok.eos_token or "")
        eos: set[int] = set()
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for v in (gen_eos, tok.eos_token_id):
            if isinstance(v, int):
                eos.add(v)
            elif isinstance(v, (list, tuple)):
                eos.update(int(x) for x in v)
        self._eos = eos
        self._table = token_bytes_table(tok)
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if isinstance(max_pos, int) and 0 < max_pos < self.n_ctx:
            self._notes.append(f"The context of {self.label} is limited to its {max_pos} positions.")
            self.n_ctx = max_pos
        self._loaded = True

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        # verbose=False: texts longer than the model's positions are chunked by the caller; the
        # tokenizer's "longer than the specified maximum sequence length" warning only misleads
        return list(self._tok(text, add_special_tokens=add_special, verbose=False)["input_ids"])

    @property
    def _cache_arg(self) -> str:
        # transformers renamed past_key_values to cache; use whichever this version's forward takes
        if self._cache_name is None:
            params = inspect.signature(self._model.forward).parameters
            self._cache_name = "cache" if "cache" in params else "past_key_values"
        return self._cache_name

    def _cache_of(self, out: Any) -> Any:
        if self._cache_arg == "cache":
            return out.get("cache")
        return out.get("past_key_values")

    def vocab_tokens(self) -> tuple[str, ...] | None:
        """Token strings by id, from the tokenizer."""
        if self._tok is None:
            return None
        if self._vocab is None:
            self._vocab = tuple(str(t) for t in self._tok.convert_ids_to_tokens(list(range(len(self._tok)))))
        return self._vocab

    def stream(
        self, ids: Sequence[int], sampling: Sampling, should_stop: StopCheck | None = None
    ) -> Generator[TokenEvent, None, StopReason]:
        """Generate after ``ids`` with the shared sampler; the return value says why it ended."""
        self._require_loaded()
        stop = self._stopper(should_stop)
        import torch

        ids = [int(i) for i in ids]
        if not ids:
            raise ChatError("The prompt has no tokens.")
        # what this generation really runs with: torch keeps a thread count per OS thread (OpenMP)
        self.threads_used = torch.get_num_threads()
        model, device = self._model, self.device
        rng = None if sampling.greedy else make_rng(sampling.seed)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generated: list[int] = []
        shown = ""
        with torch.inference_mode():
            past = None
            out = None
            for start in range(0, len(ids), PROMPT_BATCH):
                if stop():
                    return StopReason.STOPPED
                chunk = torch.tensor([ids[start : start + PROMPT_BATCH]], device=device)
                out = model(input_ids=chunk, use_cache=True, logits_to_keep=1, **{self._cache_arg: past})
                past = self._cache_of(out)
            n_seen = len(ids)
            for i in range(sampling.max_tokens):
                if stop():
                    return StopReason.STOPPED
                if generated:
                    if n_seen >= self.n_ctx:
                        return StopReason.CONTEXT
                    step = torch.tensor([[generated[-1]]], device=device)
                    out = model(input_ids=step, use_cache=True, **{self._cache_arg: past})
                    past = self._cache_of(out)
                    n_seen += 1
                logits = out.logits[0, -1].float().cpu().numpy()
                tok, p = choose(
                    logits, rng, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
                )
                if tok in self._eos:
                    return StopReason.EOS
                generated.append(tok)
                if self._table is not None:
                    text = decoder.decode(self._table[tok] if tok < len(self._table) else b"")
                else:
                    full = self._tok.decode(generated, skip_special_tokens=True)
                    text = "" if full.endswith("\ufffd") else full[len(shown) :]
                    shown += text
                yield TokenEvent(i, tok, text, p)
        return StopReason.LENGTH

    def logits(self, ids: Sequence[int]) -> Any:
        """float32 logits (n, vocab) of one forward pass over ``ids`` from an empty context."""
        self._require_loaded()
        import torch

        with torch.inference_mode():
            out = self._model(
                input_ids=torch.tensor([[int(i) for i in ids]], device=self.device), use_cache=False
            )
        return out.logits[0].float().cpu().numpy()

    @property
    def torch_model(self) -> Any:
        """The loaded ``transformers`` model (for the lab's fine-tuning); None until loaded."""
        return self._model

    @property
    def tokenizer(self) -> Any:
        """The loaded ``transformers`` tokenizer; None until loaded."""
        return self._tok

    @property
    def param_count(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        self._require_loaded()
        return int(sum(p.numel() for p in self._model.parameters()))

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of plain text (BOS added as the tokenizer does by default)."""
        self._require_loaded()
        return self._tokenize(text, add_special)

    @property
    def bos_id(self) -> int | None:
        """The BOS id when the tokenizer adds one to plain text, else None."""
        self._require_loaded()
        bos = self._tok.bos_token_id
        if bos is None:
            return None
        probe = self._tokenize("a", True)
        return int(bos) if probe and probe[0] == bos else None

    def close(self) -> None:
        """Drop the model (and free GPU memory)."""
        had_gpu = self.device not in ("", "cpu")
        self._model = None
        self._tok = None
        self._loaded = False
        if had_gpu:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]
