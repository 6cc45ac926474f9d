"""The Ray executor: units as Ray tasks, shared inputs in Ray's object store.

Faults: a worker process that dies is replaced and its task run again by Ray (``max_retries``; the
units are deterministic, so the result is the same); a cluster that goes away while units run is one
sentence (``ClusterLost``); cancel stops every task still queued or running (``ray.cancel``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from studio.core.executor import ClusterError, ClusterSpec, Unit, _Progress
from studio.core.jobs import JobCancelled, JobContext, null_context

RETRIES = 3  # a worker killed mid-task: its task runs again on another (or a new) worker
_WAIT_S = 0.25  # how often a wait for results looks at the cancel flag


class ClusterLost(ClusterError):
    """The cluster went away while units were running."""


def _source_root() -> str:
    import studio

    return str(Path(studio.__file__).resolve().parent.parent)


class RayExecutor:
    """Units as Ray tasks on the cluster ``spec`` names (connects, or starts a local one)."""

    distributed = True

    def __init__(self, spec: ClusterSpec, *, device: str = "cpu") -> None:
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
                    ray.init(address=spec.address, **kw)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ClusterError(f"Cannot reach the {self.label}: {first[:200]}") from None
            self._owns = True
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
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=_WAIT_S)
                for ref in ready:
                    i = pending.pop(ref)
                    out = ray.get(ref)
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
            raise ClusterLost(f"The {self.label} was lost after {prog.done} of {total} {what}.") from None
        finally:
            if pending:
                self._cancel(pending)

    def _cancel(self, pending: dict[Any, int]) -> None:
        import ray

        for ref in list(pending):
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - a task that just finished, or a cluster already gone
                pass
        pending.clear()

    def close(self) -> None:
        """Shut down what this executor started (a cluster it only joined keeps running)."""
        if self._owns:
            import ray

            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 - a lost cluster cannot be shut down cleanly
                pass
            self._owns = False


def _is_studio(err: Any) -> bool:
    from studio.core.errors import StudioError

    return isinstance(err, StudioError)


def _first_line(err: Any) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


__all__ = ["ClusterLost", "RayExecutor"]
