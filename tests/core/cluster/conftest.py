"""A real Ray cluster on 127.0.0.1 for the cluster tests (two worker CPUs), stopped afterwards."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.core.calib.conftest import calib_text  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[3]


def ray_or_skip() -> None:
    """Skip (saying why) when Ray, the optional extra, is not installed."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'quant-studio[cluster]')")


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[object]:
    """A local Ray cluster with two workers started by the executor itself (``--cluster local:2``)."""
    ray_or_skip()
    from studio.core.cluster import open_executor

    ex = open_executor("local:2")
    try:
        yield ex
    finally:
        ex.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class HeadProcess:
    """``ray start --head --block`` with two worker CPUs and a Ray client port, as a child process group."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.client = free_port(), free_port()
        env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
        ray_bin = Path(sys.executable).with_name("ray")
        self.proc = subprocess.Popen(
            [
                str(ray_bin),
                "start",
                "--head",
                "--block",
                f"--port={self.port}",
                f"--ray-client-server-port={self.client}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],  # fmt: skip
            env=env,
            stdout=open(tmp / "ray-head.log", "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.address = f"ray://127.0.0.1:{self.client}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.client)) == 0:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited: {(tmp / 'ray-head.log').read_text()[-2000:]}")
            time.sleep(0.5)
        self.kill()
        raise RuntimeError("the Ray head did not open its client port within 120 s")

    def kill(self) -> None:
        """Every process of this cluster, at once (what a machine that goes away does)."""
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this child leads (start_new_session)
        except ProcessLookupError:
            pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
