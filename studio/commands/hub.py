"""``quant-studio-cli hub``: search the Hub, show a model, download it (resumable, verified), manage the cache.

The token comes from the OS keyring, ``HF_TOKEN`` or huggingface_hub's login, never from the command
line (where other users could read it in the process list).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from studio.core.jobs import JobContext


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``hub`` command and its sub-commands."""
    p = subparsers.add_parser(
        "hub", help="search, inspect and download Hugging Face Hub models; manage the cache"
    )
    sub = p.add_subparsers(dest="hub_command", metavar="HUB_COMMAND")
    p.set_defaults(handler=lambda args: _help(p))

    s = sub.add_parser("search", help="search models on the Hub")
    s.add_argument("query", help="text contained in the model id")
    s.add_argument("--task", help="pipeline tag, e.g. text-generation")
    s.add_argument("--library", help="library, e.g. transformers or gguf")
    s.add_argument("--sort", default="downloads", choices=["downloads", "likes", "last_modified", "trending"])
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--offset", type=int, default=0, help="skip this many results (paging)")
    s.add_argument("--json", action="store_true", help="print a JSON list")
    s.set_defaults(handler=_search)

    i = sub.add_parser("info", help="files, sizes, parameters, license and card of a model")
    i.add_argument("repo", help="repository id, e.g. org/model")
    i.add_argument("--revision", help="branch, tag or commit (default main)")
    i.add_argument("--json", action="store_true", help="print a JSON object")
    i.set_defaults(handler=_info)

    d = sub.add_parser("download", help="download (or resume) a model into the Hugging Face cache")
    d.add_argument("repo", help="repository id, e.g. org/model")
    d.add_argument("--revision", help="branch, tag or commit (default main)")
    d.add_argument("--include", action="append", metavar="GLOB", help="only files matching GLOB (repeatable)")
    d.add_argument("--exclude", action="append", metavar="GLOB", help="skip files matching GLOB (repeatable)")
    d.add_argument("--cache-dir", help="cache folder (default: the Hugging Face cache)")
    d.add_argument("--json", action="store_true", help="print a JSON object with the local path")
    d.set_defaults(handler=_download)

    c = sub.add_parser("cache", help="list cached models; delete one; clean up leftovers")
    c.add_argument("--delete", metavar="REPO", help="delete this cached model")
    c.add_argument("--revision", help="with --delete: only this revision")
    c.add_argument("--cleanup", action="store_true", help="remove partial downloads and stale lock files")
    c.add_argument("--cache-dir", help="cache folder (default: the Hugging Face cache)")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(handler=_cache)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _token() -> str | None:
    from studio.core.hub.auth import get_token

    return get_token()[0]


def _fmt_int(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _search(args: argparse.Namespace) -> int:
    from studio.core.hub.api import search

    results = search(
        args.query,
        task=args.task,
        library=args.library,
        sort=args.sort,
        limit=args.limit,
        offset=args.offset,
        token=_token(),
    )
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
        return 0
    if not results:
        print("no models found")
        return 0
    width = max(len(r.id) for r in results)
    print(f"{'MODEL':<{width}}  {'DOWNLOADS':>9}  {'LIKES':>6}  {'PARAMS':>7}  TASK")
    for r in results:
        flag = " (gated)" if r.gated else ""
        print(
            f"{r.id:<{width}}  {_fmt_int(r.downloads):>9}  {r.likes:>6}  {_fmt_int(r.params):>7}  "
            f"{r.pipeline_tag or '-'}{flag}"
        )
    return 0


def _info(args: argparse.Namespace) -> int:
    from studio.core.hub.api import model_details
    from studio.core.hub.download import format_bytes

    d = model_details(args.repo, revision=args.revision, token=_token())
    if args.json:
        print(json.dumps(d.to_json(), indent=2))
        return 0
    print(f"{d.id}  (commit {d.sha or '?'})")
    print(f"  parameters: {_fmt_int(d.params)}   license: {d.license or '-'}   task: {d.pipeline_tag or '-'}")
    print(f"  downloads: {d.downloads}   likes: {d.likes}   gated: {'yes' if d.gated else 'no'}")
    print(f"  total size: {format_bytes(d.total_size)} in {len(d.files)} files")
    width = max((len(f.name) for f in d.files), default=4)
    for f in d.files:
        extra = f"  {f.quant_type}" if f.quant_type else ""
        print(f"    {f.name:<{width}}  {format_bytes(f.size or 0):>10}{extra}")
    return 0


class _Printer:
    """Progress on stderr, at most twice a second, so logs of long downloads stay readable."""

    def __init__(self) -> None:
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, p: Any) -> None:
        now = time.monotonic()
        if now - self.last < 0.5 and p.done < p.total:
            return
        self.last = now
        line = f"[{p.file_index}/{p.n_files}] {p.message}"
        if self.tty:
            print("\r" + line[:150].ljust(150), end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _download(args: argparse.Namespace) -> int:
    from studio.core.hub.download import download_snapshot

    printer = _Printer()
    ctx = JobContext(on_log=lambda msg: print(msg, file=sys.stderr))
    try:
        res = download_snapshot(
            args.repo,
            args.revision,
            args.include,
            args.cache_dir,
            ctx,
            _token(),
            exclude=args.exclude,
            on_progress=printer,
        )
    finally:
        printer.close()
    if args.json:
        out = {
            "path": str(res.path),
            "repo_id": res.repo_id,
            "commit": res.commit,
            "files": list(res.files),
            "downloaded_bytes": res.downloaded_bytes,
            "from_cache": res.from_cache,
        }
        print(json.dumps(out, indent=2))
    else:
        if res.note:
            print(res.note, file=sys.stderr)
        print(res.path)
    return 0


def _cache(args: argparse.Namespace) -> int:
    from studio.core.hub.cache import delete_cached, find_leftovers, list_cached, remove_leftovers
    from studio.core.hub.download import format_bytes

    if args.delete:
        freed = delete_cached(args.delete, args.revision, args.cache_dir)
        if args.json:
            print(json.dumps({"deleted": args.delete, "revision": args.revision, "freed_bytes": freed}))
        else:
            print(
                f"deleted {args.delete}{' @ ' + args.revision if args.revision else ''}: {format_bytes(freed)} freed"
            )
        return 0
    if args.cleanup:
        items = find_leftovers(args.cache_dir)
        freed = remove_leftovers(items)
        removed = [str(i.path) for i in items if not i.path.exists()]
        if args.json:
            print(json.dumps({"removed": removed, "freed_bytes": freed}))
        else:
            kept = len(items) - len(removed)
            busy = f"; {kept} in use by a running download were kept" if kept else ""
            print(f"removed {len(removed)} leftover file(s), {format_bytes(freed)} freed{busy}")
        return 0
    models = list_cached(args.cache_dir)
    if args.json:
        print(json.dumps([m.to_json() for m in models], indent=2))
        return 0
    if not models:
        print("the cache is empty")
        return 0
    width = max(len(m.repo_id) for m in models)
    print(f"{'MODEL':<{width}}  {'SIZE':>10}  {'REVISIONS':>9}  LAST USED")
    for m in models:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.last_accessed))
        print(f"{m.repo_id:<{width}}  {format_bytes(m.size_on_disk):>10}  {len(m.revisions):>9}  {used}")
    return 0
