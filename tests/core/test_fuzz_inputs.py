"""Issue 25: a fuzz test over the files users hand the studio (FAULTS.md, wave 3).

Plan JSON, imatrix GGUF and .dat, JSONL chats and GGUF sources are mutated (structured values such
as 1e400, 2**64-1, 5000-digit integers, deep nesting and lone surrogates, and raw byte flips,
truncations and boundary integers) and handed to the code that reads them. Every case must end in
success or a one-sentence ``StudioError``: no other exception, no case over 60 s, and nothing left
in the output folder but a complete output. The default tier runs a seeded sample; the slow tier
runs 200 cases per kind and prints the counts.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from studio.core.calib.data import ChatFormat, read_chats, render_chats
from studio.core.calib.imatrix import Imatrix, ImatrixEntry, check_for_model, read_imatrix, write_imatrix
from studio.core.errors import StudioError
from studio.core.factory import CHATML_TEMPLATE
from studio.core.model import open_model

try:  # the export pipeline, plans and layouts moved to their own modules (issue 22)
    from studio.core.export.run import export_gguf
    from studio.core.gguf.layout import layout
    from studio.core.plan.plan import Plan, plan_from_preset
except ImportError:  # this branch, before that move
    from studio.core.export.run import export_gguf
    from studio.core.gguf.arch import layout
    from studio.core.plan.plan import Plan, plan_from_preset
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of

HOSTILE_VALUES: list[Any] = [
    1e400,
    -1e400,
    -1,
    0,
    2**40,
    2**64 - 1,
    -(2**63),
    3e38,
    "",
    "x" * 100_000,
    "\ud800",
    None,
    True,
    [],
    {},
    [[[[[[[[]]]]]]]],
    {"a": {"b": {"c": 1}}},
    "(.*.*.*.*)*Z$",
    "Q4_K",
    "F32",
]
BOUNDARY_U32 = [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
BOUNDARY_U64 = [0, 2**32, 2**63 - 1, 2**63, 2**64 - 1]


# ------------------------------------------------------------------------------------ mutations


def _mutate_value(obj: Any, rng: random.Random) -> Any:
    """``obj`` (parsed JSON) with one value, key or container replaced by something hostile."""
    if isinstance(obj, dict) and obj:
        k = rng.choice(list(obj))
        r = rng.random()
        if r < 0.15:
            return {kk: v for kk, v in obj.items() if kk != k}
        if r < 0.6:
            return {**obj, k: _mutate_value(obj[k], rng)}
        return {**obj, k: rng.choice(HOSTILE_VALUES)}
    if isinstance(obj, list) and obj:
        i = rng.randrange(len(obj))
        out = list(obj)
        out[i] = _mutate_value(obj[i], rng) if rng.random() < 0.5 else rng.choice(HOSTILE_VALUES)
        return out
    return rng.choice(HOSTILE_VALUES)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=True, allow_nan=True)


def _mutate_json_text(text: str, rng: random.Random) -> str:
    """Text-level mutations the json module cannot produce."""
    r = rng.random()
    if r < 0.2:
        return "[" * 100_000 + text + "]" * 100_000
    if r < 0.4:
        return text.replace("1", "9" * 5000, 1)
    if r < 0.55:
        cut = rng.randrange(max(1, len(text)))
        return text[:cut]
    if r < 0.7:
        return text.replace('"', "", 1)
    if r < 0.85:
        return text.replace("1", "1e400", 1)
    b = bytearray(text.encode("utf-8"))
    for _ in range(rng.randint(1, 8)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return b.decode("utf-8", errors="surrogateescape").encode("utf-8", errors="replace").decode("utf-8")


def _mutate_bytes(data: bytes, rng: random.Random, header: int) -> bytes:
    """Byte flips, boundary integers and truncations, mostly in the first ``header`` bytes."""
    b = bytearray(data)
    r = rng.random()
    if r < 0.15:
        return bytes(b[: rng.randrange(len(b))])
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(min(len(b), header) if rng.random() < 0.85 else len(b))
        kind = rng.random()
        if kind < 0.4:
            b[at] = rng.randrange(256)
        elif kind < 0.7 and at + 4 <= len(b):
            b[at : at + 4] = rng.choice(BOUNDARY_U32).to_bytes(4, "little")
        elif at + 8 <= len(b):
            b[at : at + 8] = rng.choice(BOUNDARY_U64).to_bytes(8, "little")
    return bytes(b)


# ------------------------------------------------------------------------------------ the runner


class Tally:
    """What the cases ended in."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.crashes: list[str] = []
        self.slowest = 0.0
        self.leftovers: list[str] = []

    def run(self, name: str, fn: Callable[[], Any], out_dir: Path | None = None) -> None:
        t0 = time.monotonic()
        try:
            fn()
            self.counts["ok"] += 1
        except StudioError as err:
            msg = str(err)
            if "\n" in msg or len(err.message) > 300:
                self.crashes.append(f"{name}: unbounded sentence {msg[:120]!r}")
            self.counts["sentence"] += 1
        except Exception as err:  # noqa: BLE001 - what the fuzz test counts
            self.counts["traceback"] += 1
            tb = traceback.format_exception(err)[-3:]
            self.crashes.append(f"{name}: {type(err).__name__}: {str(err)[:150]} | {''.join(tb)[-400:]}")
        took = time.monotonic() - t0
        self.slowest = max(self.slowest, took)
        if took > 60:
            self.crashes.append(f"{name}: took {took:.0f} s")
        if out_dir is not None and out_dir.exists():
            left = [p.name for p in out_dir.iterdir() if p.name != "out.gguf"]
            if left:
                self.leftovers.append(f"{name}: {left}")
            shutil.rmtree(out_dir)

    def check(self, kind: str, n: int) -> None:
        print(
            f"\nfuzz {kind}: {n} cases, {self.counts['ok']} ok, {self.counts['sentence']} one-sentence errors, "
            f"{self.counts['traceback']} tracebacks, {len(self.leftovers)} with leftovers, slowest {self.slowest:.1f} s"
        )
        assert not self.crashes, "\n".join(self.crashes[:10])
        assert not self.leftovers, "\n".join(self.leftovers[:10])
        assert sum(self.counts.values()) == n


def _cases(request: pytest.FixtureRequest, default: int) -> int:
    return 200 if request.node.get_closest_marker("slow") else default


# ------------------------------------------------------------------------------------ the kinds


@pytest.fixture(scope="module")
def info(llama_model):
    with open_model(llama_model) as ck:
        return ck.info


def _imatrix(info) -> Imatrix:
    entries = {}
    for tm in layout(info).tensors:
        if tm.gguf_name.startswith("blk.") and len(tm.shape) == 2:
            entries[tm.gguf_name] = ImatrixEntry(
                tm.gguf_name,
                np.linspace(0.1, 2.0, tm.n_per_row, dtype=np.float32).reshape(1, -1),
                np.array([64.0], np.float32),
            )
    return Imatrix(dict(sorted(entries.items())), ("fuzz",), 2, 64)


def _fuzz_plans(n: int, seed: int, info, tmp_path: Path) -> None:
    rng = random.Random(seed)
    seeds = [
        json.loads(plan_from_preset(info, "Q4_K_M").to_json()),
        {
            "version": 1,
            "recipe": {
                "kind": "first_last",
                "n": 1,
                "high": "Q8_0",
                "low": "Q4_0",
                "overrides": [["down", "Q5_0"]],
            },
        },
        {
            "version": 1,
            "recipe": {"kind": "preset", "preset": "Q4_K_M", "keep_first_last": {"n": 1, "type": "Q8_0"}},
        },
    ]
    tally = Tally()
    for i in range(n):
        base = rng.choice(seeds)
        text = _dumps(_mutate_value(base, rng))
        if rng.random() < 0.35:
            text = _mutate_json_text(text, rng)

        def case(text: str = text) -> None:
            plan = Plan.from_json(text, info, source="fuzz.json")
            plan.summary(info)
            Plan.from_json(plan.to_json(), info)

        tally.run(f"plan {i}", case)
    tally.check("plan JSON", n)


def _fuzz_imatrix(n: int, seed: int, info, model: Path, tmp_path: Path, fmt: str) -> None:
    rng = random.Random(seed)
    good = write_imatrix(_imatrix(info), tmp_path / f"good.{fmt}").path
    data = Path(good).read_bytes()
    header = 4096 if fmt == "gguf" else len(data)
    tally = Tally()
    exported = 0
    for i in range(n):
        p = tmp_path / f"case.{fmt}"
        p.write_bytes(_mutate_bytes(data, rng, header))
        out_dir = tmp_path / f"out-{i}"
        out_dir.mkdir()

        def case(p: Path = p, out_dir: Path = out_dir) -> None:
            nonlocal exported
            im = read_imatrix(p)
            check_for_model(im, info)
            if exported < max(2, n // 20):  # an export with some of the files that pass
                exported += 1
                export_gguf(model, out_dir / "out.gguf", "Q4_K_S", imatrix=im)

        tally.run(f"imatrix {fmt} {i}", case, out_dir)
    tally.check(f"imatrix {fmt}", n)


def _fuzz_chats(n: int, seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    lines = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    ]
    fmt = ChatFormat(CHATML_TEMPLATE, "<s>", "</s>", "fuzz")
    tally = Tally()
    for i in range(n):
        rows = [_dumps(rng.choice(lines)) for _ in range(3)]
        r = rng.random()
        if r < 0.5:
            rows[rng.randrange(3)] = _dumps(_mutate_value(rng.choice(lines), rng))
        elif r < 0.85:
            rows[rng.randrange(3)] = _mutate_json_text(rows[0], rng)
        p = tmp_path / "chats.jsonl"
        p.write_text("\n".join(rows), encoding="utf-8", errors="surrogatepass")

        def case(p: Path = p) -> None:
            render_chats(read_chats(p), fmt)

        tally.run(f"chats {i}", case)
    tally.check("JSONL chats", n)


def _patch_dim(data: bytes, rng: random.Random, names: list[str]) -> bytes:
    """One tensor's dimension in the header set to 0, 1 or a boundary integer."""
    k = rng.choice(names).encode()
    at = data.index(struct.pack("<Q", len(k)) + k) + 8 + len(k)
    n_dims = struct.unpack_from("<I", data, at)[0]
    pos = at + 4 + 8 * rng.randrange(max(1, min(n_dims, 4)))
    value = rng.choice([0, 0, 1, 2**31, 2**63, 2**64 - 1])
    return data[:pos] + struct.pack("<Q", value) + data[pos + 8 :]


def _fuzz_gguf_sources(n: int, seed: int, sources: list[Path], tmp_path: Path) -> None:
    from studio.core.gguf.read import read_gguf

    rng = random.Random(seed)
    bases = [(p.read_bytes(), [t.name for t in read_gguf(p).tensors]) for p in sources]
    tally = Tally()
    for i in range(n):
        data, names = rng.choice(bases)
        mutated = _patch_dim(data, rng, names) if rng.random() < 0.4 else _mutate_bytes(data, rng, 64 * 1024)
        p = tmp_path / "src.gguf"
        p.write_bytes(mutated)
        out_dir = tmp_path / f"out-{i}"
        out_dir.mkdir()

        def case(p: Path = p, out_dir: Path = out_dir) -> None:
            with open_model(p) as ck:
                for t in ck.info.tensors:
                    ck.read(t.name)
                layout(ck.info)
            export_gguf(p, out_dir / "out.gguf", "Q8_0")

        tally.run(f"gguf source {i}", case, out_dir)
    tally.check("GGUF sources", n)


# ------------------------------------------------------------------------------------ the tests


@pytest.fixture(params=[pytest.param("default"), pytest.param("slow", marks=pytest.mark.slow)])
def n_cases(request):
    return 200 if request.param == "slow" else None


def test_fuzz_plan_json(n_cases, info, tmp_path):
    _fuzz_plans(n_cases or 40, 25 if n_cases is None else 2025, info, tmp_path)


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
def test_fuzz_imatrix(fmt, n_cases, info, llama_model, tmp_path):
    _fuzz_imatrix(n_cases or 15, 25 if n_cases is None else 2025, info, llama_model, tmp_path, fmt)


def test_fuzz_jsonl_chats(n_cases, tmp_path):
    _fuzz_chats(n_cases or 30, 25 if n_cases is None else 2025, tmp_path)


def test_fuzz_gguf_sources(n_cases, chat_model, gguf_of, tmp_path):
    sources = [gguf_of(chat_model, "F32"), gguf_of(chat_model, "Q4_K_M")]
    _fuzz_gguf_sources(n_cases or 12, 25 if n_cases is None else 2025, sources, tmp_path)
