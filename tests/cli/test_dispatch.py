"""The CLI's dispatch: every subcommand's arguments module names a handler that exists, and parsing
(``--help`` included) loads nothing of the core beyond its vocabulary; the handler's module is
imported only when its command runs."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

from studio.cli import COMMANDS, build_parser, handler_of
from studio.core.llamacpp.kvcache import KV_TYPES

ROOT = Path(__file__).resolve().parents[2]


def _subparsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for every subcommand and sub-subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subparsers(sub, (*path, name))


def test_every_command_names_a_handler_that_exists():
    seen = []
    for path, sub in _subparsers(build_parser()):
        handler = sub.get_default("handler")
        assert handler is not None, f"{' '.join(path)} sets no handler"
        fn = handler_of(argparse.Namespace(handler=handler))
        assert callable(fn), f"{' '.join(path)}: {handler!r} is not a function"
        if isinstance(handler, str):
            module = handler.partition(":")[0]
            # a hyphenated command (bench-model) lives in the module of its name with an underscore
            assert module == f"studio.commands.{path[0].replace('-', '_')}", (
                f"{' '.join(path)} runs in {module}"
            )
            assert list(inspect.signature(fn).parameters) == ["args"]
        seen.append(path[0].replace("-", "_"))
    assert sorted(set(seen)) == sorted(COMMANDS)


def test_the_arguments_modules_import_no_handler():
    # an arguments module only registers: the handler module is named by a string, never imported
    for name in COMMANDS:
        module = importlib.import_module(f"studio.commands.args.{name}")
        source = Path(module.__file__).read_text(encoding="utf-8")
        assert f"studio.commands.{name} " not in source
        assert "from studio.core" not in source, f"studio.commands.args.{name} imports the core"


def test_parsing_and_help_load_no_handler_and_nothing_heavy():
    code = (
        "import json, sys\n"
        "from studio.cli import build_parser\n"
        "p = build_parser()\n"
        "p.parse_args(['export', 'M', '-o', 'x.gguf', '--preset', 'Q4_K_M'])\n"
        "p.format_help()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = set(json.loads(r.stdout))
    handlers = sorted(f"studio.commands.{n}" for n in COMMANDS if f"studio.commands.{n}" in loaded)
    assert not handlers, f"parsing imported the handlers {handlers}"
    for heavy in ("numpy", "gguf", "torch", "transformers", "studio.core.model", "studio.core.calib"):
        assert heavy not in loaded, f"parsing imported {heavy}"


def test_memory_offers_the_kv_cache_types_of_the_core():
    (memory,) = [sub for path, sub in _subparsers(build_parser()) if path == ("memory",)]
    (kv,) = [a for a in memory._actions if "--kv-type" in a.option_strings]
    assert tuple(kv.choices) == KV_TYPES
