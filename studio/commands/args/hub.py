"""The arguments of ``quant-studio-cli hub``; its handler is in ``studio.commands.hub``."""

from __future__ import annotations

import argparse
import sys

from studio.commands import _numbers as numbers
from studio.commands import _options as options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``hub`` command and its sub-commands."""
    p = subparsers.add_parser(
        "hub",
        help="search, inspect, download and upload Hugging Face Hub models; manage the cache",
        description=(
            "Search the Hugging Face Hub, show a model's files and whether it fits this machine, download "
            "it into the standard cache (resumable, checksum-verified) and manage that cache. The token "
            "for gated models comes from the OS keyring, HF_TOKEN or `hf auth login`; HF_ENDPOINT picks "
            "a mirror and HF_HUB_OFFLINE=1 uses only the local cache."
        ),
    )
    sub = p.add_subparsers(dest="hub_command", metavar="HUB_COMMAND")
    p.set_defaults(handler=lambda args: _help(p))

    s = sub.add_parser("search", help="search models on the Hub", description="Search models on the Hub.")
    s.add_argument("query", metavar="QUERY", help="text contained in the model id ('' for all)")
    s.add_argument("--task", metavar="TASK", help="pipeline tag, e.g. text-generation")
    s.add_argument("--library", metavar="LIB", help="library, e.g. transformers or gguf")
    s.add_argument(
        "--sort",
        default="downloads",
        choices=["downloads", "likes", "last_modified", "trending"],
        help="order of the results (default downloads)",
    )
    s.add_argument(
        "--limit", type=numbers.LIMIT, default=20, metavar="N", help="show at most N models (default 20)"
    )
    s.add_argument(
        "--offset", type=numbers.LISTED, default=0, metavar="N", help="skip the first N results (paging)"
    )
    options.add_json(s, "a JSON list")
    s.set_defaults(handler="studio.commands.hub:_search")

    i = sub.add_parser(
        "info",
        help="files, sizes, parameters, license and card of a model",
        description="A model's files and sizes, parameters, license and card, and whether it fits this machine.",
    )
    i.add_argument("repo", metavar="REPO", help="repository id, e.g. org/model")
    i.add_argument("--revision", metavar="REV", help="branch, tag or commit (default main)")
    options.add_json(i, "a JSON object")
    i.set_defaults(handler="studio.commands.hub:_info")

    d = sub.add_parser(
        "download",
        help="download (or resume) a model into the Hugging Face cache",
        description=(
            "Download a model into the Hugging Face cache, resuming partial files and checking each "
            "file's checksum; prints the local snapshot folder, which inspect and export accept."
        ),
    )
    d.add_argument("repo", metavar="REPO", help="repository id, e.g. org/model")
    d.add_argument("--revision", metavar="REV", help="branch, tag or commit (default main)")
    d.add_argument("--include", action="append", metavar="GLOB", help="only files matching GLOB (repeatable)")
    d.add_argument("--exclude", action="append", metavar="GLOB", help="skip files matching GLOB (repeatable)")
    d.add_argument("--cache-dir", metavar="DIR", help="cache folder (default: the Hugging Face cache)")
    options.add_json(d, "a JSON object with the local path")
    d.set_defaults(handler="studio.commands.hub:_download")

    u = sub.add_parser(
        "upload",
        help="upload a GGUF to a Hub model repository, with a generated model card",
        description=(
            "Upload a GGUF file to the model repository USER/NAME (created if needed, private with "
            "--private) in one commit with a README model card written from the file's metadata and its "
            "last evaluation (quant-studio-cli eval keeps it beside the file). The token needs write "
            "access; it comes from the OS keyring, HF_TOKEN or `hf auth login`. A failed upload leaves "
            "the Hub as it was, and the message says so."
        ),
    )
    u.add_argument("file", metavar="FILE.gguf", help="the GGUF file to upload")
    u.add_argument("--repo", required=True, metavar="USER/NAME", help="the model repository to upload to")
    u.add_argument("--private", action="store_true", help="create the repository as private")
    options.add_json(u, "a JSON object (with the card's text)")
    u.set_defaults(handler="studio.commands.hub:_upload")

    c = sub.add_parser(
        "cache",
        help="list cached models; delete one; clean up leftovers",
        description="List the models in the local Hugging Face cache, delete one, or remove leftovers.",
    )
    c.add_argument("--delete", metavar="REPO", help="delete this cached model")
    c.add_argument("--revision", metavar="REV", help="with --delete: only this revision")
    c.add_argument("--cleanup", action="store_true", help="remove partial downloads and stale lock files")
    c.add_argument("--cache-dir", metavar="DIR", help="cache folder (default: the Hugging Face cache)")
    options.add_json(c, "JSON")
    c.set_defaults(handler="studio.commands.hub:_cache")


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
