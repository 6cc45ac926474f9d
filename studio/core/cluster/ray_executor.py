"""The Ray executor: units as Ray tasks, shared inputs in Ray's object store.

Faults: a worker process that dies is replaced and its task run again by Ray (``max_retries``; the
units are deterministic, so the result is the same); a cluster that goes away while units run is one
sentence (``ClusterLost``); cancel stops every task still queued or running (``ray.cancel``).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import studio
from studio.core.cluster.calibrate import calibrate_on_cluster
from studio.core.cluster.evaluate import score_on_cluster
from studio.core.cluster.quantize import round_layer
from studio.core.cluster.scan import scan_on_cluster
from studio.core.errors import StudioError
from studio.core.executor import ClusterError, ClusterSpec, Unit, _Progress
from studio.core.jobs import JobCancelled, JobContext, null_context

RETRIES = 3  # a worker killed mid-task: its task runs again on another (or a new) worker
_WAIT_S = 0.25  # how often a wait for results looks at the cancel flag
_PROBE_S = 2.0  # a call that takes longer: is the head still there?
_PROBE_FAILURES = 3  # consecutive probes the head did not answer: the cluster is lost


class ClusterLost(ClusterError):
    """The cluster went away while units were running."""


def _source_root() -> str:
    return str(Path(studio.__file__).resolve().parent.parent)


class RayExecutor:
    """Units as Ray tasks on the cluster ``spec`` names (connects, or starts a local one)."""

    distributed = True

    def job(self, name: str) -> Callable[..., Any]:
        """The cluster's implementation of a studio job: ``calibrate``, ``scan``, ``round_layer`` or ``score``."""
        jobs = {
            "calibrate": calibrate_on_cluster,
            "scan": scan_on_cluster,
            "round_layer": round_layer,
            "score": score_on_cluster,
        }
        if name in jobs:
            return jobs[name]
        raise ClusterError(f"The Ray executor has no '{name}' job.")

    def __init__(self, spec: ClusterSpec, *, device: str = "cpu") -> None:
        # a Ray call after the cluster is gone must fail, not connect to another cluster of this machine
        # (read when Ray is first imported)
        os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
        import ray

        self.spec = spec
        self.label = spec.describe()
        self.device = device
        self._owns = False
        self._remote: dict[int, Any] = {}
        if not ray.is_initialized():
            # workers import this very studio (a checkout or the installed package), not another one
            env = {"env_vars": {"PYTHONPATH": _source_root()}}
            kw: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
            try:
                if spec.kind == "local":
                    ray.init(
                        address="local",
                        num_cpus=spec.workers or os.cpu_count() or 1,
                        include_dashboard=False,
                        runtime_env=env,
                        _node_ip_address="127.0.0.1",  # a cluster of this machine only: nothing listens outside
                        **kw,
                    )
                elif spec.kind == "auto":
                    ray.init(address="auto", **kw)
                else:
                    _token_if_any()
                    _connect(ray, spec.address, kw)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ClusterError(f"Cannot reach the {self.label}: {first[:200]}") from None
            self._owns = True
        self._caller: _Caller | None = None
        self._lost = False
        self._probe = _probe_address(spec)
        res = ray.cluster_resources()
        self.workers = max(1, int(res.get("GPU" if device.startswith("cuda") else "CPU", 1)))

    def share(self, value: Any) -> Any:
        """``ray.put(value)``: once, whatever number of units reads it."""
        import ray

        return ray.put(value)

    def fetch(self, shared: Any) -> Any:
        """``ray.get`` of a shared reference (inside a unit)."""
        import ray

        return ray.get(shared)

    def _task(self, fn: Callable[..., Any], resources: dict[str, float] | None) -> Any:
        import ray

        opts: dict[str, Any] = {"num_cpus": 1, "max_retries": RETRIES, "retry_exceptions": False}
        if self.device.startswith("cuda"):
            opts["num_gpus"] = 1
        opts.update(resources or {})
        key = (id(fn), tuple(sorted(opts.items())))
        if key not in self._remote:
            self._remote[key] = ray.remote(fn).options(**opts)
        return self._remote[key]

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
        """Submit every unit, yield ``(index, result)`` as each finishes."""
        import ray
        from ray import exceptions as rx

        ctx = ctx or null_context()
        total = total or done_before + sum(u.weight for u in units)
        prog = _Progress(ctx, what, done_before, total)
        task = self._task(fn, resources)
        pending: dict[Any, int] = {}
        try:
            for i, u in enumerate(units):
                pending[task.remote(*u.args)] = i
            while pending:
                if ctx.cancelled:
                    raise JobCancelled()
                refs = list(pending)
                ready = self._call(lambda refs=refs: ray.wait(refs, num_returns=1, timeout=_WAIT_S)[0], ctx)
                for ref in ready:
                    i = pending.pop(ref)
                    out = self._call(lambda ref=ref: ray.get(ref), ctx)
                    prog.step(units[i].weight)
                    yield i, out
        except JobCancelled:
            self._cancel(pending)
            raise
        except rx.RayTaskError as err:
            self._cancel(pending)
            cause = getattr(err, "cause", None)
            if isinstance(cause, ClusterError | JobCancelled) or _is_studio(cause):
                raise cause from None
            raise ClusterError(f"A unit failed on the {self.label}: {_first_line(cause or err)}") from None
        except rx.WorkerCrashedError:
            self._cancel(pending)
            raise ClusterError(
                f"A worker of the {self.label} died {RETRIES + 1} times on the same unit (out of memory?)."
            ) from None
        except (
            ConnectionError,
            rx.RaySystemError,
            rx.GetTimeoutError,
            rx.NodeDiedError,
            rx.ObjectLostError,
            rx.OwnerDiedError,
            rx.RpcError,
        ):
            self._lost = True  # no more Ray calls: after a lost client, Ray would look for another cluster
            raise ClusterLost(f"The {self.label} was lost after {prog.done} of {total} {what}.") from None
        finally:
            if pending:
                self._cancel(pending)

    def _call(self, fn: Callable[[], Any], ctx: JobContext) -> Any:
        """``fn()`` on the caller thread; while it runs, the cluster is probed: a cluster whose head no
        longer accepts connections is lost (Ray's own calls may wait for it for minutes)."""
        if self._caller is None:
            self._caller = _Caller()
        job = self._caller.submit(fn)
        failures = 0
        while not job.done.wait(_PROBE_S):
            if ctx.cancelled:
                raise JobCancelled()
            failures = 0 if self._head_answers() else failures + 1
            if failures >= _PROBE_FAILURES:
                self._lost = True
                raise ConnectionError("the cluster's head does not answer")
        if job.error is not None:
            raise job.error
        return job.result

    def _head_answers(self) -> bool:
        if self._probe is None:
            return True
        try:
            with socket.create_connection(self._probe, timeout=_PROBE_S):
                return True
        except OSError:
            return False

    def _cancel(self, pending: dict[Any, int]) -> None:
        if self._lost:
            pending.clear()
            return
        import ray

        for ref in list(pending):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - a task that just finished, or a cluster already gone
                pass
        pending.clear()

    def close(self) -> None:
        """Shut down what this executor started (a cluster it only joined keeps running)."""
        if self._owns and self._lost:
            # Ray's shutdown would wait for the lost head; this process leaves Ray as it is
            self._owns = False
            return
        if self._owns:
            import ray

            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 - a lost cluster cannot be shut down cleanly
                pass
            self._owns = False


class _Job:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _Caller:
    """One daemon thread that makes Ray's blocking calls, so that the caller can give up on a call
    that waits for a lost cluster (a daemon thread does not hold the process at exit)."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[_Job] = queue.Queue()
        threading.Thread(target=self._loop, name="ray-calls", daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> _Job:
        job = _Job(fn)
        self._jobs.put(job)
        return job

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.fn()
            except BaseException as err:  # noqa: BLE001 - handed to the caller as it was raised
                job.error = err
            job.done.set()


_CONNECT_TRIES = 3  # a Ray client server that is slow to start its session answers "Initialization failure"


def _connect(ray: Any, address: str | None, kw: dict[str, Any]) -> None:
    """``ray.init(address)``; a client session the server failed to start (a busy head) is asked again."""
    for attempt in range(_CONNECT_TRIES):
        try:
            ray.init(address=address, **kw)
            return
        except ConnectionError as err:
            if attempt + 1 == _CONNECT_TRIES or "Initialization failure" not in str(err):
                raise
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 - nothing was connected
                pass
            time.sleep(2.0 * (attempt + 1))


def _probe_address(spec: ClusterSpec) -> tuple[str, int] | None:
    """Where the cluster's head accepts connections (None: a cluster this process started)."""
    addr = spec.address
    if spec.kind == "auto":
        try:
            import ray

            addr = ray.get_runtime_context().gcs_address
        except Exception:  # noqa: BLE001 - no address known: no probe
            return None
    if not addr:
        return None
    host, _, port = addr.removeprefix("ray://").rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def _token_if_any() -> None:
    """Send this machine's Ray token (``~/.ray/auth_token``, or ``$RAY_AUTH_TOKEN``) to a cluster that
    asks for one: Ray's client attaches it only once token authentication is switched on here, which
    Ray does for clusters it starts but not for a ``ray://`` connection. ``RAY_AUTH_MODE`` set by the
    user wins."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._private.authentication import authentication_token_setup as tokens

        tokens.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    except (ImportError, AttributeError, TypeError):
        pass  # another Ray version: its own defaults apply


def _is_studio(err: Any) -> bool:
    return isinstance(err, StudioError)


def _first_line(err: Any) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


__all__ = ["ClusterLost", "RayExecutor"]
