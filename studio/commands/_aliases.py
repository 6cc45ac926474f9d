"""Model names that stand for a model the studio keeps in its cache: ``BENCH`` for the 1.5B bench model.

``resolve_aliases`` runs in ``studio.cli.main`` before ``check_args``: every model argument of the
command (``SPECS``' MODEL and HF_FOLDER paths) that reads ``BENCH`` becomes the cached GGUF's path,
so every subcommand takes it as MODEL. Not fetched here: a missing bench model is one sentence that
names ``quant-studio-cli bench-model``.
"""

from __future__ import annotations

import argparse

from studio.commands._check import SPECS, Kind, PathArg, command_name

# the same word as studio.core.benchmodel.BENCH_ALIAS (not imported: --help stays light)
BENCH_ALIAS = "BENCH"


def resolve_aliases(args: argparse.Namespace) -> None:
    """Replace the model alias ``BENCH`` in ``args`` by the cached bench GGUF's path."""
    for spec in SPECS.get(command_name(args), ()):
        if not isinstance(spec, PathArg) or spec.kind not in (Kind.MODEL, Kind.HF_FOLDER):
            continue
        value = getattr(args, spec.dest, None)
        if isinstance(value, list):
            setattr(args, spec.dest, [_resolve(v) for v in value])
        elif value is not None:
            setattr(args, spec.dest, _resolve(value))


def _resolve(value: object) -> object:
    if value != BENCH_ALIAS:
        return value
    from studio.core.benchmodel import bench_model_path  # here: it imports numpy, which parsing must not

    return str(bench_model_path())
