"""``quant-studio-cli``: the headless face of Quant Studio over ``studio.core``.

Each subcommand's arguments live in ``studio.commands.args.<name>`` (``register(subparsers)``, light:
argparse and the option helpers only), and its handler in ``studio.commands.<name>``, which imports
what it needs at its top. The arguments module names the handler as ``"module:function"``;
``main`` imports it only when that command runs, so ``--help`` loads nothing of the core. The handler
returns an exit code. A ``StudioError`` becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from studio import __version__
from studio.commands._aliases import resolve_aliases
from studio.commands._check import check_args
from studio.commands._numbers import annotate as annotate_ranges
from studio.commands._options import check_cluster
from studio.core.errors import StudioError
from studio.core.untrusted import terminal_safe

# Subcommands (their modules in studio.commands.args and studio.commands), in the order of --help.
COMMANDS = (
    "inspect",
    "export",
    "eval",
    "chat",
    "hub",
    "demo",
    "bench_model",
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
        importlib.import_module(f"studio.commands.args.{name}").register(sub)
    annotate_ranges(parser)  # every numeric option's help says its range (studio.commands._numbers)
    return parser


def handler_of(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The parsed command's handler: its ``"module:function"`` imported now (or a callable as is)."""
    handler = args.handler
    if callable(handler):
        return handler
    module, _, name = handler.partition(":")
    return getattr(importlib.import_module(module), name)


class Stopped(KeyboardInterrupt):
    """SIGTERM (or SIGINT) while a command runs: a KeyboardInterrupt, so that every ``finally`` and
    context manager on the way out runs: child processes are ended, spools and ``*.partial`` removed."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def _on_stop_signals() -> dict[int, object]:
    """Turn SIGTERM and SIGINT into ``Stopped`` (main thread only); the handlers they replace."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}


def _end_helpers() -> None:
    """End the process-wide helper children a stopped command leaves: the chat-template child (a calibration
    text of chats renders in it) and multiprocessing's resource tracker, waited for, so that none outlives
    the command, not even as an unreaped zombie."""
    worker = sys.modules.get("studio.core.chat.template_worker")
    if worker is not None:
        worker.stop_worker()
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    stop = getattr(getattr(tracker, "_resource_tracker", None), "_stop", None)
    if callable(stop):
        with contextlib.suppress(Exception):  # a private helper of CPython's: best effort
            stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # a number out of its range is a BadNumber, one line as below
    except StudioError as err:
        print(f"error: {terminal_safe(str(err))}", file=sys.stderr)
        return 2
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    previous = _on_stop_signals()
    try:
        if getattr(args, "cluster", None):  # a cluster that cannot be used is refused before any work
            check_cluster(args.cluster)
        resolve_aliases(args)  # BENCH: the cached bench model
        check_args(args)  # paths and numbers before any model is loaded (studio.commands._check)
        code = int(handler_of(args)(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe must not surface at interpreter exit
        return code
    except StudioError as err:
        print(f"error: {terminal_safe(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        # by now every context manager on the way out has ended its children and removed its partials
        _end_helpers()
        sig = str(err) if isinstance(err, Stopped) else "SIGINT"
        print(
            f"error: {sig}: {args.command} was stopped; its child processes and partial files were removed.",
            file=sys.stderr,
        )
        return 143 if sig == "SIGTERM" else 130
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python's exit flush from failing too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
