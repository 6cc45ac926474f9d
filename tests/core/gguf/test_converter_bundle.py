"""The converter bundle: copied out of a llama-cpp-python sdist, refused for another runtime version,
loaded beside the studio's own gguf package without replacing it."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from studio.core.errors import ExportError
from studio.core.gguf import converter_bundle as cb


def _sdist(path: Path, version: str, extra: dict[str, str] | None = None) -> Path:
    root = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    files = {
        root + "convert_hf_to_gguf.py": "# cli\n",
        root + "LICENSE": "MIT\n",
        root + "conversion/__init__.py": "TEXT_MODEL_MAP: dict[str, str] = {'FooForCausalLM': 'foo'}\n",
        root + "conversion/foo.py": "import gguf\nARCH = gguf.NAME\n",
        root + "gguf-py/gguf/__init__.py": "NAME = 'bundle-gguf'\n",
        root + "gguf-py/gguf/constants.py": "X = 1\n",
        root + "gguf-py/pyproject.toml": "[project]\n",  # not part of the bundle
        root + "src/llama.cpp": "// not part of the bundle\n",
        f"llama_cpp_python-{version}/setup.py": "",
        **(extra or {}),
    }
    with tarfile.open(path, "w:gz") as tf:
        for name, text in files.items():
            data = text.encode()
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def test_install_copies_only_the_converter_and_stamps_the_version(tmp_path):
    dest = tmp_path / "bundle"
    b = cb.install_from_sdist(_sdist(tmp_path / "llama_cpp_python-9.9.9.tar.gz", "9.9.9"), dest)
    assert b.llama_cpp_python == "9.9.9" and b.path == dest
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == [
        "LICENSE",
        "bundle.json",
        "conversion/__init__.py",
        "conversion/foo.py",
        "convert_hf_to_gguf.py",
        "gguf/__init__.py",
        "gguf/constants.py",
    ]
    stamp = json.loads((dest / "bundle.json").read_text())
    assert stamp["source"] == "llama_cpp_python-9.9.9.tar.gz" and len(stamp["sha256"]) == 6
    assert cb._known(str(dest)) == {"FooForCausalLM"}  # read without importing the package


def test_reinstall_replaces_the_old_bundle(tmp_path):
    dest = tmp_path / "bundle"
    cb.install_from_sdist(_sdist(tmp_path / "llama_cpp_python-1.0.0.tar.gz", "1.0.0"), dest)
    b = cb.install_from_sdist(_sdist(tmp_path / "llama_cpp_python-1.0.1.tar.gz", "1.0.1"), dest)
    assert b.llama_cpp_python == "1.0.1"
    assert not list(tmp_path.glob("*.partial")) and not (tmp_path / "bundle.old").exists()


def test_hostile_archive_path_is_refused(tmp_path):
    bad = {"llama_cpp_python-1.0.0/vendor/llama.cpp/conversion/../../../../escape.py": "x"}
    with pytest.raises(ExportError):
        cb.install_from_sdist(
            _sdist(tmp_path / "llama_cpp_python-1.0.0.tar.gz", "1.0.0", bad), tmp_path / "b"
        )
    assert not (tmp_path / "escape.py").exists()
    assert not (tmp_path / "b").exists()


def test_not_an_sdist_is_refused(tmp_path):
    with pytest.raises(ExportError, match="not a llama-cpp-python sdist"):
        cb.install_from_sdist(_sdist(tmp_path / "other-1.0.tar.gz", "1.0"), tmp_path / "b")


def test_a_bundle_for_another_runtime_is_refused_with_one_sentence(tmp_path, monkeypatch):
    dest = tmp_path / "bundle"
    cb.install_from_sdist(_sdist(tmp_path / "llama_cpp_python-0.0.1.tar.gz", "0.0.1"), dest)
    monkeypatch.setenv(cb.ENV_VAR, str(dest))
    monkeypatch.setattr(cb, "runtime_version", lambda: "0.3.36")
    b, why = cb.find_bundle()
    assert b is None
    assert why is not None and "0.0.1" in why and "0.3.36" in why and "install.sh" in why
    assert why.count(". ") == 0 and why.endswith(".")
    monkeypatch.setenv(cb.ENV_VAR, str(tmp_path / "missing"))
    b, why = cb.find_bundle()
    assert b is None and "not installed" in why and "install.sh" in why


def test_bundle_modules_see_their_own_gguf(tmp_path, monkeypatch):
    """A bundle module's ``import gguf`` is the bundle's gguf-py; the studio's stays the installed one."""
    import gguf

    dest = tmp_path / "bundle"
    cb.install_from_sdist(_sdist(tmp_path / "llama_cpp_python-7.7.7.tar.gz", "7.7.7"), dest)
    # the private module names are per process: set aside a real bundle another test loaded
    saved_modules = {k: sys.modules.pop(k) for k in list(sys.modules) if k.startswith("_qs_llamacpp_")}
    saved_path = list(sys.meta_path)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, cb._BundleFinder)]
    cb._install_finder(dest)
    try:
        mod = __import__(cb.CONVERSION_MODULE + ".foo", fromlist=["ARCH"])
        assert mod.ARCH == "bundle-gguf"
        assert sys.modules[cb.GGUF_MODULE].NAME == "bundle-gguf"
        assert sys.modules["gguf"] is gguf and not hasattr(gguf, "NAME")
    finally:
        for k in [k for k in sys.modules if k.startswith("_qs_llamacpp_")]:
            del sys.modules[k]
        sys.modules.update(saved_modules)
        sys.meta_path[:] = saved_path


def test_installed_converter_matches_the_runtime():
    """Where install.sh ran: the real bundle loads, its gguf-py is not the studio's, both coexist."""
    from tests.core.export.converter_fixtures import need_converter

    need_converter()
    import gguf

    c = cb.load_converter()
    assert c.bundle.llama_cpp_python == cb.runtime_version()
    assert c.gguf is not gguf and c.gguf.__name__ == cb.GGUF_MODULE
    assert sys.modules["gguf"] is gguf
    # the converter needs its own gguf-py: it knows architectures the installed one does not
    assert len(c.gguf.MODEL_ARCH) >= len(gguf.MODEL_ARCH)
    assert {"Qwen3MoeForCausalLM", "MixtralForCausalLM", "Gemma3ForCausalLM"} <= cb.known_architectures()
