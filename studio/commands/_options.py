"""The options several subcommands share, each added by one function with one help text.

Subcommands import this module as ``options`` and call ``options.add_json(p)`` and so on.
"""

from __future__ import annotations

from typing import Any

from studio.commands import _numbers as numbers
from studio.core.executor import INSTALL_HINT, ClusterError, ClusterSpec, ray_installed
from studio.core.llamacpp.options import EXTRA_BUFFER_CHOICES


def add_json(parser: Any, what: str = "one JSON object instead of text") -> None:
    """``--json``: print ``what`` (on stdout) instead of the text output."""
    parser.add_argument("--json", action="store_true", help=f"print {what}")


def add_allow_pickle(parser: Any) -> None:
    """``--allow-pickle``: accept pickle weights, converted in a child process, never unpickled here."""
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="accept a pickle pytorch_model.bin (loaded with torch.load(weights_only=True) in a child process)",
    )


def add_extra_buffers(parser: Any, what: str) -> None:
    """``--llama-extra-buffers {auto,on,off}``: llama.cpp's weight repacking for ``what``."""
    parser.add_argument(
        "--llama-extra-buffers",
        choices=EXTRA_BUFFER_CHOICES,
        default="auto",
        help=(
            f"llama.cpp's extra buffer types (repacked weights) for {what}: auto (the default) is off on "
            "a CPU with AMX or after a crash with them on this machine, on otherwise"
        ),
    )


def add_dtype(parser: Any, help: str | None = None) -> None:
    """``--dtype {auto,float32,float16,bfloat16}`` for models run in torch (default auto)."""
    # studio.core.chat.hf_backend.DTYPES; importing it here would cost the CLI's start about a second
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"), help=help
    )


def add_gpu_layers(parser: Any) -> None:
    """``--gpu-layers N``: llama.cpp layers offloaded to the GPU."""
    parser.add_argument(
        "--gpu-layers",
        type=numbers.GPU_LAYERS,
        default=0,
        metavar="N",
        help="llama.cpp layers on the GPU (-1: all)",
    )


def add_dequantize(parser: Any, flag: str) -> None:
    """``--dequantize``: run the GGUF given as ``flag`` in transformers (see ``_common.dequantized``)."""
    parser.add_argument(
        "--dequantize",
        action="store_true",
        help=f"run a .gguf {flag} in transformers, from the float32 Hugging Face folder the studio "
        "writes from it (made once, cached), instead of in llama.cpp at its stored precision",
    )


def add_cluster(parser: Any) -> None:
    """``--cluster auto|local:N|ray://HOST:PORT``: run the independent units on a Ray cluster."""
    parser.add_argument(
        "--cluster",
        metavar="auto|local:N|ray://HOST:PORT",
        default=None,
        help="run the work's independent units on a Ray cluster (needs quant-studio[cluster]): auto (the "
        "cluster `ray start` runs here), local:N (start N workers on this machine) or ray://HOST:PORT",
    )


def check_cluster(value: str) -> None:
    """Refuse a ``--cluster`` value that names no cluster, or any cluster without Ray installed."""
    ClusterSpec.parse(value)
    if not ray_installed():
        raise ClusterError(f"--cluster needs Ray, which is not installed: {INSTALL_HINT}.")


def add_rotate(parser: Any) -> None:
    """``--rotate`` and ``--rotate-seed N``: fold a randomised Hadamard rotation into the weights."""
    parser.add_argument(
        "--rotate",
        action="store_true",
        help=(
            "fold a randomised Hadamard rotation into the weights (QuaRot's R1 and R2; any llama.cpp runs "
            "the file, which may quantize better; a tied head is untied; gemma, gemma2, gemma3, olmo2 and "
            "bert get R2 alone)"
        ),
    )
    parser.add_argument(
        "--rotate-seed",
        type=numbers.Whole(0, 2**32 - 1),
        default=0,
        metavar="N",
        help="the rotation's seed (default 0)",
    )
