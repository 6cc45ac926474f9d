"""Dump every ``quant-studio-cli [<cmd>] --help`` text into a folder, to compare two checkouts byte for byte.

Each text is printed by a fresh ``python -m studio.cli`` (so the import cost is real too) at a fixed
terminal width; ``--compare OTHER`` then diffs the folder against an earlier dump.

    python bench/cli_help.py OUT_DIR [--compare EARLIER_DIR]
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands() -> list[str]:
    """The subcommands, in --help order (read from the checkout's CLI)."""
    sys.path.insert(0, str(ROOT))
    from studio.cli import COMMANDS

    return [name if isinstance(name, str) else name[0] for name in COMMANDS]


def dump(out: Path) -> dict[str, float]:
    """Write ``<cmd>.txt`` (and ``_main.txt``) into ``out``; returns the seconds each took."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    seconds = {}
    for name in ["_main", *commands()]:
        argv = ["--help"] if name == "_main" else [name, "--help"]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "studio.cli", *argv], capture_output=True, env=env, cwd=ROOT, check=False
        )
        seconds[name] = time.perf_counter() - t0
        (out / f"{name}.txt").write_bytes(proc.stdout + proc.stderr + f"\nexit {proc.returncode}\n".encode())
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, default=None, metavar="EARLIER_DIR")
    args = parser.parse_args()
    seconds = dump(args.out)
    print(" ".join(f"{k}={v:.2f}s" for k, v in seconds.items()))
    if args.compare is None:
        return 0
    differ = 0
    for old in sorted(args.compare.glob("*.txt")):
        new = args.out / old.name
        a = old.read_bytes()
        b = new.read_bytes() if new.is_file() else b""
        if a != b:
            differ += 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    a.decode().splitlines(True), b.decode().splitlines(True), str(old), str(new)
                )
            )
    print(f"{differ} of {len(list(args.compare.glob('*.txt')))} help texts differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
