"""Real child processes for the issue-25 tests: a CLI run held open so it can be killed with SIGKILL at a
known point, and a calibration whose checkpoint is truncated while it runs.

The child is ``python -c CODE`` run from the repository root (so this worktree's ``studio`` is imported).
``HOLD`` patches pause the child at a point where its partial output exists; the kill itself is real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# argv: HOLD FLAG CLI-ARGS... ; HOLD is "writer" (the GGUF writer's partial file has its header),
# "spool" (after the first spooled tensor of a calibrated export) or "none".
HOLD = r"""
import sys, time
from pathlib import Path
hold, flag, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]

def pause():
    flag.touch()
    time.sleep(600)

if hold == "writer":
    from studio.core.gguf import writer
    orig_b = writer.AtomicGGUFWriter.begin
    def begin(self):
        orig_b(self)
        self._file.flush()
        pause()
    writer.AtomicGGUFWriter.begin = begin
elif hold == "spool":
    from studio.core.calib import spool
    orig_p = spool.TensorSpool.put
    def put(self, *a, **k):
        orig_p(self, *a, **k)
        self._f.flush()
        pause()
    spool.TensorSpool.put = put
from studio.cli import main
sys.exit(main(argv))
"""

# Truncate the checkpoint while calibration runs: right after the run has read layer 0's weights, the
# file is cut where layer 0's data begins (as a sync client or another process replacing it would).
# Before issue 25 the run computed from memory maps of those weights and died of SIGBUS; now it holds
# copies, and the next read (layer 1) comes up short: one sentence.
TRUNCATE = r"""
import os
from studio.core.calib import runner
_orig_load = runner._Materializer.load
_done = []

def load(self, paths):
    n = _orig_load(self, paths)
    names = [self.sk.names[p] for p in paths if ".layers.0." in p]
    if names and not _done:
        entries = self.ckpt._entries
        os.truncate(self.ckpt.info.tensor(names[0]).file, min(entries[x].begin for x in names))
        _done.append(True)
    return n

runner._Materializer.load = load
"""


def child_env() -> dict[str, str]:
    """The environment of a child: one thread each, offscreen Qt."""
    return dict(os.environ, OMP_NUM_THREADS="1", QT_QPA_PLATFORM="offscreen")


def run_cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``quant-studio-cli ARGV`` in a fresh child process (a fresh process start time)."""
    return subprocess.run(
        [sys.executable, "-c", HOLD, "none", os.devnull, *argv],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def kill_cli_when_held(hold: str, flag: Path, *argv: str, timeout: float = 300) -> int:
    """Start ``quant-studio-cli ARGV`` held at ``hold``; SIGKILL it there; returns its exit status."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, hold, str(flag), *argv],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + timeout
    try:
        while not flag.exists():
            if proc.poll() is not None:
                raise AssertionError(f"the child ended before it was held: {proc.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("the child was never held")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def leftovers(folder: Path) -> list[str]:
    """Names in ``folder`` (hidden ones too) that are partial files or spools."""
    return sorted(n for n in os.listdir(folder) if n.endswith(".partial") or ".spool-" in n)
