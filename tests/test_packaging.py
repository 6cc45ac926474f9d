"""The wheel ships every package and every data file, and an installed copy finds its data outside the checkout."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")


def _setuptools_cfg() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def _source_packages() -> set[str]:
    """Every folder under studio/ that holds Python files, as a dotted package name."""
    out = set()
    for py in (ROOT / "studio").rglob("*.py"):
        rel = py.parent.relative_to(ROOT)
        if "__pycache__" not in rel.parts:
            out.add(".".join(rel.parts))
    return out


def test_every_studio_package_is_listed_in_pyproject() -> None:
    listed = set(_setuptools_cfg()["packages"])
    missing = sorted(_source_packages() - listed)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"
    mapped = _setuptools_cfg()["package-dir"]
    for pkg in listed:
        folder = ROOT / mapped[pkg] if pkg in mapped else ROOT.joinpath(*pkg.split("."))
        assert (folder / "__init__.py").is_file(), f"{pkg} is listed but {folder} is not a package"


def test_checkout_reads_its_own_data_folders() -> None:
    from studio.paths import data_dir, icon_path, resource_path

    assert data_dir("resources") == ROOT / "resources"
    assert data_dir("icons") == ROOT / "icons"
    assert resource_path("eval", "sample_en.txt").is_file()
    assert icon_path("quant-studio").is_file()


def _can_build_offline() -> bool:
    spec = importlib.util.find_spec("setuptools")
    if spec is None:
        return False
    import setuptools

    return int(setuptools.__version__.split(".")[0]) >= 77


@pytest.mark.skipif(not _can_build_offline(), reason="setuptools>=77 is needed to build the wheel here")
def test_built_wheel_ships_data_and_finds_it_when_installed(tmp_path: Path) -> None:
    # Build from a copy holding only the files git knows, as a clean clone would.
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    if files.returncode != 0:
        pytest.skip("not a git checkout")
    src = tmp_path / "src"
    for name in files.stdout.splitlines():
        p = ROOT / name
        if p.is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(p.read_bytes())
    # A new file dropped under resources/ must ship without any packaging edit.
    (src / "resources" / "calib").mkdir()
    (src / "resources" / "calib" / "new.txt").write_text("added later\n", encoding="utf-8")
    out = tmp_path / "whl"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(src),
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = [n for n in files.stdout.splitlines() if (ROOT / n).is_file()]
    for kind, pkg in (("resources", "studio/_resources"), ("icons", "studio/_icons")):
        for n in tracked:
            if n.startswith(kind + "/") and not n.startswith("resources/screenshots/"):
                assert pkg + n[len(kind) :] in names, f"{n} is missing from the wheel"
    assert "studio/_resources/calib/new.txt" in names
    assert not any("/screenshots/" in n for n in names), "README screenshots were shipped"
    assert not any(n.startswith(("resources/", "icons/", "tests/", "bench/")) for n in names)
    assert not any("__pycache__" in n for n in names)

    # Unpack it as pip would and ask from another folder, with this checkout off sys.path.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from studio.paths import resource_path, icon_path;"
        "from studio.core.evaluate.texts import load_text;"
        "import studio;"
        "print(studio.__file__); print(resource_path('calib', 'new.txt').read_text().strip());"
        "print(icon_path('quant-studio')); print(len(load_text('sample').text))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(site)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    pkg_file, new_text, icon, sample_len = res.stdout.splitlines()
    assert Path(pkg_file).is_relative_to(site)
    assert new_text == "added later"
    assert Path(icon).is_relative_to(site) and Path(icon).is_file()
    assert int(sample_len) > 10_000


def test_smoke_test_reports_a_model_that_does_not_open(tmp_path: Path) -> None:
    # What packaging/check_wheel.sh and check_bundle.sh rely on: one JSON line, exit status 1.
    missing = tmp_path / "no-such-model"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "studio.app",
            str(missing),
            "--smoke-test",
            "--settings",
            str(tmp_path / "s.ini"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    import json

    lines = res.stdout.strip().splitlines()
    assert lines, (
        f"no report (exit {res.returncode}); stderr: {res.stderr[-2000:]}"
    )  # say why, if it flakes again
    report = json.loads(lines[-1])
    assert res.returncode == 1 and report["ok"] is False and report["model"] is None
    assert "no-such-model" in report["error"] and report["icon"] is True
