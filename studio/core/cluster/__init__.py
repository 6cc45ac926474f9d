"""Running the studio's units of work on a Ray cluster (the optional extra ``quant-studio[cluster]``).

The package sits above the features it distributes (``calib``, ``evaluate``): they reach its jobs only
through the executor they are given (``Executor.job``), never by importing it.
"""

from __future__ import annotations

from studio.core import executor
from studio.core.cluster.ray_executor import RayExecutor

__all__ = ["open_executor"]


def open_executor(cluster: str | executor.ClusterSpec | None, *, device: str = "cpu") -> executor.Executor:
    """The executor ``cluster`` names (None or "" or "none": in this process).

    ClusterError (one sentence) when Ray is not installed or the cluster cannot be reached.
    """
    if cluster is None or (isinstance(cluster, str) and cluster.strip() in ("", "none", "in-process")):
        return executor.InProcess()
    spec = cluster if isinstance(cluster, executor.ClusterSpec) else executor.ClusterSpec.parse(cluster)
    if not executor.ray_installed():
        raise executor.ClusterError(
            f"Running on a {spec.describe()} needs Ray, which is not installed: {executor.INSTALL_HINT}."
        )
    return RayExecutor(spec, device=device)
