"""Where independent units of work run: in this process (the default) or on a Ray cluster.

The calibration, the sensitivity scan, calibrated quantization and evaluation cut their work into
units that do not depend on each other (a few calibration chunks, a scan's (tensor, type) pairs of
some layers, a tensor given its Hessian, a variant × text chunk) and hand them to an ``Executor``:

* ``InProcess`` runs them here, one after the other (what the studio always did);
* ``studio.core.cluster.ray_executor.RayExecutor`` sends them to a Ray cluster (the optional extra
  ``quant-studio[cluster]``): big inputs go to Ray's object store once (``share``) and every unit
  gets a reference.

``studio.core.cluster.open_executor("local:2")`` parses the ``--cluster`` value (``auto``, ``local:N``,
``ray://HOST:PORT``; ``HOST:PORT`` joins a cluster as a driver) and never imports Ray unless a cluster
is asked for, so the studio starts without it.
"""

from __future__ import annotations

import importlib.util
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from studio.core.errors import StudioError
from studio.core.jobs import JobContext, null_context
from studio.core.units import format_eta

INSTALL_HINT = "pip install 'quant-studio[cluster]' (or pip install ray)"


class ClusterError(StudioError):
    """A cluster cannot be reached, was lost, or Ray is not installed."""


@dataclass(frozen=True)
class ClusterSpec:
    """A ``--cluster`` value: ``kind`` is "local" (start one here with ``workers`` CPUs), "auto" (the
    cluster ``ray start`` runs on this machine, or ``$RAY_ADDRESS``), "client" (``ray://HOST:PORT``)
    or "address" (``HOST:PORT`` of a head's GCS)."""

    kind: str
    workers: int | None = None
    address: str | None = None

    @staticmethod
    def parse(text: str) -> ClusterSpec:
        """The spec ``text`` names; ClusterError (one sentence) when it names none."""
        s = text.strip()
        if s == "auto":
            return ClusterSpec("auto")
        m = re.fullmatch(r"local(?::(\d+))?", s)
        if m:
            n = int(m.group(1)) if m.group(1) else None
            if n is not None and n < 1:
                raise ClusterError(f"A local cluster needs at least one worker, not {n}.")
            return ClusterSpec("local", n)
        if re.fullmatch(r"ray://[^\s/:]+:\d+", s):
            return ClusterSpec("client", address=s)
        if re.fullmatch(r"[^\s/:]+:\d+", s):
            return ClusterSpec("address", address=s)
        raise ClusterError(
            f"{text!r} is not a cluster: use auto, local:N (N workers on this machine) or ray://HOST:PORT."
        )

    def describe(self) -> str:
        """How the window and the logs name it."""
        if self.kind == "local":
            n = "all CPUs" if self.workers is None else f"{self.workers} worker{'s' * (self.workers != 1)}"
            return f"local Ray cluster ({n})"
        if self.kind == "auto":
            return "Ray cluster (auto)"
        return f"Ray cluster at {self.address}"


@dataclass(frozen=True)
class Unit:
    """One independent piece of work: ``fn(*args)``; ``weight`` is how many units of progress it
    counts for (a task of 12 (tensor, type) pairs counts 12); ``key`` names it in messages."""

    args: tuple[Any, ...]
    weight: int = 1
    key: str = ""


class Executor(Protocol):
    """Runs units and yields ``(index, result)`` as each finishes (in any order)."""

    label: str
    distributed: bool  # False: the caller may keep its own in-process path (today's, batched)
    workers: int

    def share(self, value: Any) -> Any:
        """``value`` where every unit can read it (Ray: ``ray.put``, once); pass the result to units."""
        ...

    def fetch(self, shared: Any) -> Any:
        """What ``share`` put (inside a unit)."""
        ...

    def run(
        self,
        fn: Callable[..., Any],
        units: Sequence[Unit],
        ctx: JobContext | None = None,
        *,
        what: str = "units",
        done_before: int = 0,
        total: int | None = None,
        resources: dict[str, float] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """Run every unit; progress per unit with an ETA; cancel stops the units still running."""
        ...

    def job(self, name: str) -> Callable[..., Any]:
        """A distributed executor's own implementation of one of the studio's jobs (``"calibrate"``,
        ``"scan"``, ``"round_layer"``, ``"score"``): the calibrated features call it through the executor, so the
        cluster package sits above them and none of them imports it."""
        ...

    def close(self) -> None:
        """Release what the executor started."""
        ...


class _Progress:
    """Per-unit progress with an ETA from the units finished in this run."""

    def __init__(self, ctx: JobContext, what: str, done: int, total: int) -> None:
        self.ctx, self.what, self.total = ctx, what, max(1, total)
        self.start_done = self.done = done
        self.t0 = time.monotonic()

    def step(self, n: int) -> None:
        self.done += n
        ran = self.done - self.start_done
        el = time.monotonic() - self.t0
        left = el / ran * max(0, self.total - self.done) if ran > 0 else None
        self.ctx.report(
            min(self.done, self.total),
            self.total,
            f"{self.done}/{self.total} {self.what} · ETA {format_eta(left)}",
        )


class InProcess:
    """Every unit here, in order (the default)."""

    label = "this process"
    distributed = False
    workers = 1

    def share(self, value: Any) -> Any:
        """``value`` itself."""
        return value

    def fetch(self, shared: Any) -> Any:
        """``shared`` itself."""
        return shared

    def run(
        self,
        fn: Callable[..., Any],
        units: Sequence[Unit],
        ctx: JobContext | None = None,
        *,
        what: str = "units",
        done_before: int = 0,
        total: int | None = None,
        resources: dict[str, float] | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """Each unit in turn (cancel is checked between units)."""
        ctx = ctx or null_context()
        prog = _Progress(ctx, what, done_before, total or done_before + sum(u.weight for u in units))
        for i, u in enumerate(units):
            ctx.check_cancelled()
            out = fn(*u.args)
            prog.step(u.weight)
            yield i, out

    def job(self, name: str) -> Callable[..., Any]:
        """None of its own: the features keep their in-process path (``distributed`` is False)."""
        raise ClusterError(f"The in-process executor has no distributed '{name}' job.")

    def close(self) -> None:
        """Nothing to release."""


def ray_installed() -> bool:
    """Whether Ray can be imported (without importing it)."""
    return importlib.util.find_spec("ray") is not None


__all__ = [
    "INSTALL_HINT",
    "ClusterError",
    "ClusterSpec",
    "Executor",
    "InProcess",
    "Unit",
    "ray_installed",
]
