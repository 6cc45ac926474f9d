"""``quant-studio-cli hub``: search the Hub, show a model, download it (resumable, verified), upload a GGUF, manage the cache.

The token comes from the OS keyring, ``HF_TOKEN`` or huggingface_hub's login, never from the command
line (where other users could read it in the process list).
"""

from __future__ import annotations

import argparse
import sys
import time

from studio.commands._common import ProgressLine, format_table, print_json
from studio.core import hardware
from studio.core.errors import StudioError
from studio.core.hub import auth
from studio.core.hub.api import model_details, search
from studio.core.hub.cache import delete_cached, find_leftovers, list_cached, remove_leftovers
from studio.core.hub.download import download_snapshot
from studio.core.hub.fit import fit_badge, gguf_fit
from studio.core.hub.upload import upload_gguf
from studio.core.jobs import JobContext
from studio.core.units import format_bytes, format_count
from studio.core.untrusted import terminal_safe


def _say(text: str, **kwargs: object) -> None:
    """Print Hub text (ids, file names, licenses): control characters escaped, never sent raw to the terminal."""
    print(terminal_safe(text, keep_newlines=True), **kwargs)  # type: ignore[call-overload]


def _token() -> str | None:
    return auth.get_token()[0]  # looked up on the module: tests replace it


def _search(args: argparse.Namespace) -> int:
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
        print_json([r.to_json() for r in results])
        return 0
    if not results:
        _say("no models found")
        return 0
    rows = [
        (
            r.id,
            format_count(r.downloads),
            str(r.likes),
            format_count(r.params),
            (r.pipeline_tag or "-") + (" (gated)" if r.gated else ""),
        )
        for r in results
    ]
    _say(format_table(("MODEL", "DOWNLOADS", "LIKES", "PARAMS", "TASK"), rows, right=(1, 2, 3)))
    return 0


def _info(args: argparse.Namespace) -> int:
    d = model_details(args.repo, revision=args.revision, token=_token())
    hw = hardware.detect(probe_torch=False)  # looked up on the module: tests replace it
    badge = fit_badge(d.config, d.params, hw)
    if args.json:
        out = d.to_json()
        out["fit"] = None
        if badge is not None:
            out["fit"] = {
                "preset": badge.preset,
                "verdict": badge.verdict,
                "memory_bytes": badge.memory_bytes,
                "best_preset": badge.best_preset,
                "estimates": [
                    {"preset": e.preset, "memory_bytes": e.memory_bytes, "verdict": e.verdict.value}
                    for e in badge.estimates
                ],
            }
        for f, fj in zip(d.files, out["files"], strict=True):
            fj["fit"] = gguf_fit(f.size, hw) if f.quant_type and f.size else None
        print_json(out)
        return 0
    _say(f"{d.id}  (commit {d.sha or '?'})")
    _say(
        f"  parameters: {format_count(d.params)}   license: {d.license or '-'}   task: {d.pipeline_tag or '-'}"
    )
    _say(f"  downloads: {d.downloads}   likes: {d.likes}   gated: {'yes' if d.gated else 'no'}")
    if badge is not None:
        best = f"; best preset that fits: {badge.best_preset}" if badge.best_preset else ""
        _say(
            f"  on this machine: {badge.label}, about {format_bytes(badge.memory_bytes)} of memory "
            f"at 4096 tokens{best}"
        )
    _say(f"  total size: {format_bytes(d.total_size)} in {len(d.files)} files")
    width = max((len(f.name) for f in d.files), default=4)
    for f in d.files:
        extra = f"  {f.quant_type}: {gguf_fit(f.size, hw)}" if f.quant_type and f.size else ""
        _say(f"    {f.name:<{width}}  {format_bytes(f.size or 0):>10}{extra}")
    return 0


def _download(args: argparse.Namespace) -> int:
    with ProgressLine(width=150) as line:
        res = download_snapshot(
            args.repo,
            args.revision,
            args.include,
            args.cache_dir,
            JobContext(on_log=line.log),
            _token(),
            exclude=args.exclude,
            on_progress=lambda p: line.show(
                f"[{p.file_index}/{p.n_files}] {p.message}", final=p.done >= p.total
            ),
        )
    if args.json:
        out = {
            "path": str(res.path),
            "repo_id": res.repo_id,
            "commit": res.commit,
            "files": list(res.files),
            "downloaded_bytes": res.downloaded_bytes,
            "from_cache": res.from_cache,
        }
        print_json(out)
    else:
        if res.note:
            _say(res.note, file=sys.stderr)
        _say(str(res.path))
    return 0


def _upload(args: argparse.Namespace) -> int:
    with ProgressLine(width=120) as line:
        res = upload_gguf(
            args.file,
            args.repo,
            token=_token(),
            private=args.private,
            ctx=JobContext(on_progress=line.fraction, on_log=line.log),
        )
    if args.json:
        print_json(res.to_json())
        return 0
    for note in res.notes:
        _say(note, file=sys.stderr)
    made = "created and uploaded to" if res.created_repo else "uploaded to"
    card = " with its model card" if res.card_written else ""
    _say(f"{res.file_name} ({format_bytes(res.file_bytes)}) {made} {res.repo_id}{card}: {res.file_url}")
    return 0


def _cache(args: argparse.Namespace) -> int:
    if args.revision and not args.delete:
        raise StudioError("--revision goes with --delete REPO (it says which revision to delete).")
    if args.delete and args.cleanup:
        raise StudioError("Use --delete or --cleanup, not both at once.")
    if args.delete:
        freed = delete_cached(args.delete, args.revision, args.cache_dir)
        if args.json:
            print_json({"deleted": args.delete, "revision": args.revision, "freed_bytes": freed})
        else:
            _say(
                f"deleted {args.delete}{' @ ' + args.revision if args.revision else ''}: {format_bytes(freed)} freed"
            )
        return 0
    if args.cleanup:
        items = find_leftovers(args.cache_dir)
        freed = remove_leftovers(items)
        removed = [str(i.path) for i in items if not i.path.exists()]
        if args.json:
            print_json({"removed": removed, "freed_bytes": freed})
        else:
            kept = len(items) - len(removed)
            busy = f"; {kept} in use by a running download were kept" if kept else ""
            _say(f"removed {len(removed)} leftover file(s), {format_bytes(freed)} freed{busy}")
        return 0
    models = list_cached(args.cache_dir)
    if args.json:
        print_json([m.to_json() for m in models])
        return 0
    if not models:
        _say("the cache is empty")
        return 0
    rows = [
        (
            m.repo_id,
            format_bytes(m.size_on_disk),
            str(len(m.revisions)),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(m.last_accessed)),
        )
        for m in models
    ]
    _say(format_table(("MODEL", "SIZE", "REVISIONS", "LAST USED"), rows, right=(1, 2)))
    return 0
