"""``quant-studio-cli``: the headless face of Quant Studio over ``studio.core``.

Each subcommand lives in its own module under ``studio.commands`` and exposes
``register(subparsers)``; the handler it installs returns an exit code. A ``StudioError`` becomes
one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from studio import __version__
from studio.commands._check import check_args
from studio.core.errors import StudioError
from studio.core.untrusted import terminal_safe

# Subcommand modules, in the order they are listed in --help.
COMMANDS = (
    "inspect",
    "export",
    "eval",
    "chat",
    "hub",
    "demo",
    "calibrate",
    "sensitivity",
    "plan",
    "sweep",
    "memory",
    "qat",
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="quant-studio-cli",
        description="Inspect, quantize, evaluate and export LLMs (the command-line face of Quant Studio).",
    )
    parser.add_argument("--version", action="version", version=f"quant-studio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"studio.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        if getattr(args, "cluster", None):  # a cluster that cannot be used is refused before any work
            from studio.commands._options import check_cluster

            check_cluster(args.cluster)
        check_args(args)  # paths and numbers before any model is loaded (studio.commands._check)
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe must not surface at interpreter exit
        return code
    except StudioError as err:
        print(f"error: {terminal_safe(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python's exit flush from failing too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
