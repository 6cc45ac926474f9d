"""The arguments of ``quant-studio-cli plan``; its handler is in ``studio.commands.plan``."""

from __future__ import annotations

from typing import Any

from studio.commands import _options as options
from studio.commands.args._heldout import add_heldout_args
from studio.commands.args._scan import add_budget_args, add_scan_args


def register(subparsers: Any) -> None:
    """Add the ``plan`` subcommand."""
    p = subparsers.add_parser(
        "plan",
        help="choose per-tensor types for a size, bits-per-weight or memory budget (writes a plan)",
        description=(
            "Scan the model's per-tensor sensitivity (cached) and choose for every tensor the type that "
            "minimises the predicted KL within the budget: file bytes (105454336, 4.5GB, 800MiB), bits "
            "per weight (4.8bpw), or run-time memory (vram=8GB, gpu) at --ctx. The plan is written as "
            "JSON for export --plan; nothing is quantized."
        ),
    )
    p.add_argument("model", metavar="MODEL", help="model folder (or cached Hub id)")
    p.add_argument("--budget", required=True, metavar="SIZE", help="bytes, 4.5GB, 4.8bpw, vram=8GB or gpu")
    p.add_argument("-o", "--output", required=True, metavar="PLAN.json", help="the plan file to write")
    p.add_argument(
        "--method",
        metavar="M",
        default="imatrix",
        help="the method the plan records for the export (default imatrix; gptq, awq, awq+gptq)",
    )
    add_budget_args(p)
    add_heldout_args(p)
    add_scan_args(p)
    options.add_rotate(p)
    options.add_json(p)
    p.set_defaults(handler="studio.commands.plan:run")
