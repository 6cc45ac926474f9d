"""The executor ``--cluster`` names, for the handlers that run independent units (scan, eval, export)."""

from __future__ import annotations

from typing import Any

from studio.core.cluster import open_executor


def open_cluster(args: Any, device: str = "cpu") -> Any:
    """The executor ``--cluster`` names (in this process without it); ClusterError in one sentence."""
    return open_executor(getattr(args, "cluster", None), device=device)
