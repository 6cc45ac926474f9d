"""Bad input before work: every subcommand's paths and numbers checked before anything is loaded.

``check_args`` runs in ``studio.cli.main`` after parsing and before the handler. The table
``SPECS`` says, per subcommand (``hub upload`` as ``"hub upload"``), which arguments are paths and
what each must be: a model (folder, ``.gguf``/``.safetensors`` file or cached Hub id), a GGUF file
(its magic is read), a UTF-8 text, a JSON file, an imatrix, an output file or folder. A missing
path or a wrong kind of file is one sentence within milliseconds, instead of an error after minutes
of evaluating or calibrating the other inputs (issue 26). Only headers are read here.
"""

from __future__ import annotations

import argparse
import codecs
import enum
import os
import re
from dataclasses import dataclass
from pathlib import Path

from studio.core import safejson
from studio.core.errors import StudioError
from studio.core.textfile import read_untrusted

GGUF_MAGIC = b"GGUF"
MODEL_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth")
TEXT_PROBE_BYTES = 1 << 16  # enough to tell a binary file from UTF-8 text
_HUB_ID = re.compile(r"[\w.\-]+/[\w.\-]+")


class Kind(enum.Enum):
    """What a path argument must be."""

    MODEL = "model"  # folder, .gguf/.safetensors/.bin file, config.json, or a cached Hub id
    HF_FOLDER = "hf_folder"  # a Hugging Face model folder (or cached Hub id), no GGUF
    GGUF = "gguf"  # an existing GGUF file
    TEXT = "text"  # a UTF-8 text file (or a built-in name, see ``builtins``)
    JSON = "json"  # a JSON file
    IMATRIX = "imatrix"  # llama.cpp's imatrix: GGUF or legacy .dat
    OUT_FILE = "out_file"  # a file to write: its folder exists, it is not a folder
    OUT_DIR = "out_dir"  # a folder to write into: not an existing file
    DIR = "dir"  # an existing folder


class BadInput(StudioError):
    """A path or argument of a command is missing or of the wrong kind (found before any work)."""


@dataclass(frozen=True)
class PathArg:
    """One path argument of a subcommand: ``dest`` in the namespace, ``flag`` as the user typed it."""

    dest: str
    kind: Kind
    flag: str
    what: str = ""  # "calibration text", "plan"; default from the kind
    builtins: tuple[str, ...] = ()  # names that stand for a built-in text instead of a path
    remote_id: bool = False  # a Hub id not in the cache is fine (the command asks the Hub)
    keys: tuple[str, ...] = ()  # a JSON file: the object's keys that must be there (its shape)


@dataclass(frozen=True)
class Minimum:
    """A numeric argument that must be at least ``least`` when given."""

    dest: str
    flag: str
    least: int = 1
    message: str = ""  # the sentence, with {value} and {least}; default "FLAG must be at least …"

    def sentence(self, value: object) -> str:
        """The refusal for ``value``."""
        if self.message:
            return self.message.format(value=value, least=self.least)
        return f"{self.flag} must be at least {self.least}, not {value}."


SCAN_KEYS = ("version", "model", "tensors")  # what Sensitivity.from_dict cannot do without
_CTX_EVAL = "A context of {value} tokens is too small to evaluate; use at least {least}."
_CTX_CALIB = "A context of {value} tokens is too small to calibrate; use at least {least}."

Spec = PathArg | Minimum

_CALIB = (
    PathArg("calib_text", Kind.TEXT, "--calib-text", "calibration text", ("builtin",)),
    Minimum("calib_ctx", "--calib-ctx", 16, _CTX_CALIB),
    Minimum("calib_chunks", "--calib-chunks", 1, "At least one chunk must be used, not {value}."),
)
_SCAN = (
    PathArg("scan", Kind.JSON, "--scan", "sensitivity scan", keys=SCAN_KEYS),
    PathArg("scan_also", Kind.TEXT, "--scan-also", "text to scan", ("builtin",)),
    Minimum("scan_ctx", "--scan-ctx", 8),
    Minimum("scan_chunks", "--scan-chunks"),
)
_EVAL_TEXTS = ("sample", "wikitext-2", "wikitext2", "wikitext")

SPECS: dict[str, tuple[Spec, ...]] = {
    "inspect": (PathArg("model", Kind.MODEL, "MODEL"), Minimum("ctx", "--ctx")),
    "export": (
        PathArg("model", Kind.MODEL, "MODEL"),
        PathArg("output", Kind.OUT_FILE, "-o", "GGUF file"),
        PathArg("plan", Kind.JSON, "--plan", "plan"),
        PathArg("imatrix", Kind.IMATRIX, "--imatrix", "importance matrix"),
        PathArg("save_plan", Kind.OUT_FILE, "--save-plan", "plan"),
        *_CALIB,
        *_SCAN,
        PathArg("heldout_text", Kind.TEXT, "--heldout-text", "held-out text"),
        Minimum("ctx", "--ctx"),
    ),
    "eval": (
        PathArg("original", Kind.MODEL, "--original", "original model"),
        PathArg("variant", Kind.GGUF, "--variant", "variant"),
        PathArg("text", Kind.TEXT, "--text", "evaluation text", _EVAL_TEXTS),
        Minimum("ctx", "--ctx", 8, _CTX_EVAL),
        Minimum("chunks", "--chunks", 1, "At least one chunk must be evaluated, not {value}."),
    ),
    "chat": (
        PathArg("model", Kind.MODEL, "--model"),
        PathArg("compare", Kind.MODEL, "--compare"),
        Minimum("ctx", "--ctx", 8, "A context of {value} tokens is too small to chat; use at least {least}."),
        Minimum("max_tokens", "--max-tokens"),
    ),
    "calibrate": (
        PathArg("model", Kind.MODEL, "MODEL"),
        PathArg("output", Kind.OUT_FILE, "-o", "imatrix"),
        PathArg("text", Kind.TEXT, "--text", "calibration text"),
        PathArg("chat", Kind.TEXT, "--chat", "chat file"),
        Minimum("ctx", "--ctx", 16, _CTX_CALIB),
        Minimum("chunks", "--chunks", 1, "At least one chunk must be used, not {value}."),
    ),
    "sensitivity": (
        PathArg("model", Kind.MODEL, "MODEL"),
        PathArg("output", Kind.OUT_FILE, "-o", "sensitivity scan"),
        *_CALIB,
        *_SCAN,
    ),
    "plan": (
        PathArg("model", Kind.MODEL, "MODEL"),
        PathArg("output", Kind.OUT_FILE, "-o", "plan"),
        *_CALIB,
        *_SCAN,
        PathArg("heldout_text", Kind.TEXT, "--heldout-text", "held-out text"),
        Minimum("ctx", "--ctx"),
    ),
    "sweep": (PathArg("model", Kind.MODEL, "MODEL"),),
    "memory": (PathArg("model", Kind.MODEL, "MODEL", remote_id=True), Minimum("ctx", "--ctx")),
    "qat": (
        PathArg("model", Kind.HF_FOLDER, "MODEL"),
        PathArg("text", Kind.TEXT, "--text", "training text", _EVAL_TEXTS),
        PathArg("eval_text", Kind.TEXT, "--eval-text", "evaluation text", _EVAL_TEXTS),
        PathArg("output", Kind.OUT_DIR, "-o", "output folder"),
        Minimum("steps", "--steps"),
        Minimum("seq_len", "--seq-len", 2),
        Minimum("batch", "--batch"),
        Minimum("eval_chunks", "--eval-chunks"),
    ),
    "hub upload": (PathArg("file", Kind.GGUF, "FILE.gguf", "file to upload"),),
    "hub download": (PathArg("cache_dir", Kind.OUT_DIR, "--cache-dir", "cache folder"),),
    "hub cache": (PathArg("cache_dir", Kind.DIR, "--cache-dir", "cache folder"),),
    "hub search": (Minimum("limit", "--limit"), Minimum("offset", "--offset", 0)),
    "hub info": (),  # a repository id only
    "demo": (),
    "bench-model": (),
}


def command_name(args: argparse.Namespace) -> str:
    """``export``, ``hub upload``: the key of ``SPECS`` for parsed ``args``."""
    name = str(getattr(args, "command", "") or "")
    sub = getattr(args, "hub_command", None)
    return f"{name} {sub}" if name == "hub" and sub else name


def check_args(args: argparse.Namespace) -> None:
    """Raise ``BadInput`` for the first missing path, wrong kind of file or out-of-range number."""
    for spec in SPECS.get(command_name(args), ()):
        value = getattr(args, spec.dest, None)
        if value is None:
            continue
        if isinstance(spec, Minimum):
            if value < spec.least:
                raise BadInput(spec.sentence(value))
            continue
        for v in value if isinstance(value, list) else [value]:
            check_path(str(v), spec)


def _label(spec: PathArg, article: str = "The") -> str:
    what = spec.what or spec.kind.value.replace("_", " ")
    return f"{article} {what} ({spec.flag})" if spec.flag.startswith("-") else f"{article} {what}"


def check_path(value: str, spec: PathArg) -> None:
    """Check one path argument against its kind; see ``Kind``."""
    if value in spec.builtins:
        return
    p = Path(value).expanduser()
    label = _label(spec)
    if spec.kind is Kind.OUT_FILE:
        _check_out_file(p, label, spec.what or "output")
        return
    if spec.kind is Kind.OUT_DIR:
        if p.exists() and not p.is_dir():
            raise BadInput(f"{label} {p} is a file, not a folder.")
        return
    if not p.exists():
        if spec.kind in (Kind.MODEL, Kind.HF_FOLDER) and _cached_hub_id(value, label, spec.remote_id):
            return
        raise BadInput(f"{label} {p} does not exist.")
    if spec.kind is Kind.DIR:
        if not p.is_dir():
            raise BadInput(f"{label} {p} is not a folder.")
        return
    if spec.kind in (Kind.MODEL, Kind.HF_FOLDER):
        _check_model(p, label, gguf_ok=spec.kind is Kind.MODEL)
        return
    if p.is_dir():
        raise BadInput(f"{label} {p} is a folder, not a file.")
    _head(p, 0, label)  # a FIFO, device or socket is refused before anything reads it
    if spec.kind is Kind.GGUF:
        _check_gguf(p, label)
    elif spec.kind is Kind.IMATRIX:
        if p.suffix.lower() != ".dat":
            _check_gguf(p, label, hint="an imatrix is a .gguf (or legacy .dat) file from calibrate")
    elif spec.kind is Kind.TEXT:
        _check_text(p, label)
    elif spec.kind is Kind.JSON:
        _check_json(p, label, spec.keys)


def _head(p: Path, n: int, label: str) -> bytes:
    return read_untrusted(p, label[4:], BadInput, kind="header", head=n)


def _check_gguf(p: Path, label: str, hint: str = "") -> None:
    if _head(p, 4, label) != GGUF_MAGIC:
        more = f"; {hint}" if hint else ""
        raise BadInput(f"{label} {p} is not a GGUF file (it does not start with 'GGUF'){more}.")


def _check_text(p: Path, label: str) -> None:
    data = _head(p, TEXT_PROBE_BYTES, label)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        raise BadInput(f"{label} {p} is not UTF-8 text.") from None
    if b"\x00" in data:
        raise BadInput(f"{label} {p} is a binary file, not UTF-8 text.")


def _check_json(p: Path, label: str, keys: tuple[str, ...]) -> None:
    data = read_untrusted(p, label[4:], BadInput, kind="json")
    if data.lstrip()[:1] not in (b"{", b"[", b'"', b"-", b"t", b"f", b"n", *(b"%d" % i for i in range(10))):
        raise BadInput(f"{label} {p} is not a JSON file.")
    safejson.loads(data, f"{label} {p}", BadInput, keys=keys)  # depth and shape: a plan is an object


def _check_out_file(p: Path, label: str, what: str) -> None:
    if p.is_dir():
        raise BadInput(f"{label} {p} is a folder; give a file name.")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise BadInput(f"Cannot write the {what} {p}: the folder {parent} does not exist.")
    if not parent.is_dir():
        raise BadInput(f"Cannot write the {what} {p}: {parent} is a file, not a folder.")


def _check_model(p: Path, label: str, *, gguf_ok: bool) -> None:
    if p.is_file():
        suffix = p.suffix.lower()
        if suffix == ".gguf":
            if not gguf_ok:
                raise BadInput(f"{label} {p} is a GGUF file; this command needs a Hugging Face model folder.")
            _check_gguf(p, label)
            return
        if suffix == ".safetensors":
            head = _head(p, 8, label)
            if len(head) < 8 or int.from_bytes(head, "little") > p.stat().st_size:
                raise BadInput(f"{label} {p} is not a safetensors file (its header is damaged).")
            return
        if suffix in MODEL_SUFFIXES or p.name == "config.json":
            return
        raise BadInput(
            f"{label} {p} is neither a GGUF file (.gguf) nor a Hugging Face model folder or .safetensors file."
        )
    if not p.is_dir():
        raise BadInput(f"{label} {p} is neither a file nor a folder.")
    if p.name.startswith("models--") or (p / "snapshots").is_dir():
        return  # a Hub cache repository; its snapshot is resolved when the model is opened
    entries = list(p.iterdir())
    if not entries:
        raise BadInput(f"{label} {p} is an empty folder.")
    # any other folder: opening it reads only its file list and headers, and says what is missing
    # (no weights, no config.json, custom code) in the sentences the model layer owns


def hub_cache_dir() -> Path:
    """The Hugging Face cache folder, as ``studio.core.hub.paths.default_cache_dir`` finds it.

    Not imported from there: ``studio.core.hub`` imports its API client, and the check must stay light.
    """
    env = os.environ
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(os.path.expandvars(os.path.expanduser(env[key])))
    if env.get("HF_HOME"):
        return Path(os.path.expandvars(os.path.expanduser(env["HF_HOME"]))) / "hub"
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def _cached_hub_id(value: str, label: str, remote_ok: bool = False) -> bool:
    """True for an ``org/name`` Hub id in the local cache; a BadInput for one that is not cached."""
    if not _HUB_ID.fullmatch(value) or value.startswith((".", "/", "~")):
        return False
    if value.lower().endswith(MODEL_SUFFIXES):
        return False  # a path to a file, not an id
    if remote_ok or (hub_cache_dir() / ("models--" + value.replace("/", "--"))).is_dir():
        return True
    raise BadInput(
        f"{label} {value} is not a local folder and is not in the Hugging Face cache; download it first "
        f"(quant-studio-cli hub download {value})."
    )
