"""The test session starts from a known environment, whatever the caller's shell exported (issue 28)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import CALLER_VARIABLES


def _under(path: str | os.PathLike[str], root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


def test_hub_and_xdg_caches_are_under_pytests_tmp_dir(tmp_path_factory) -> None:
    """The user's real Hub cache is never touched: every cache the libraries would use is ours."""
    import huggingface_hub.constants as hf_constants

    base = tmp_path_factory.getbasetemp()
    for var in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"):
        assert _under(os.environ[var], base), f"{var}={os.environ[var]} is not under {base}"
    # What huggingface_hub latched at import is the same folder, so no test reaches ~/.cache.
    assert _under(hf_constants.HF_HUB_CACHE, base), hf_constants.HF_HUB_CACHE
    assert _under(hf_constants.HF_HOME, base), hf_constants.HF_HOME
    home_cache = Path.home() / ".cache" / "huggingface"
    assert not _under(hf_constants.HF_HUB_CACHE, home_cache)


def test_callers_offline_token_and_threads_do_not_reach_the_tests() -> None:
    """HF_HUB_OFFLINE, a token, thread counts and a hidden GPU from the shell are gone."""
    import huggingface_hub.constants as hf_constants

    for var in CALLER_VARIABLES:
        if var in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"):
            continue
        assert var not in os.environ, f"{var} leaked from the caller's shell"
    assert hf_constants.HF_HUB_OFFLINE is False
    from huggingface_hub import get_token

    assert get_token() is None  # neither the caller's HF_TOKEN nor their login file


def test_a_test_that_needs_offline_mode_sets_it_in_a_child() -> None:
    """huggingface_hub latches HF_HUB_OFFLINE at import, so offline is tried in a child process."""
    code = (
        "import huggingface_hub.constants as c; "
        "from studio.core.hub.paths import is_offline; "
        "print(c.HF_HUB_OFFLINE, is_offline())"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_the_hub_tests_pass_under_a_hobbyists_shell(tmp_path) -> None:
    """The Hub CLI tests pass with the caller's offline flag, a token, a missing HF_HOME and 7 threads.

    The same run is in .ci/run; here one Hub test stands for it, in a child pytest with those variables.
    """
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_TOKEN="hf_x",
        HF_HOME="/nonexistent",
        OMP_NUM_THREADS="7",
    )
    env.pop("PYTEST_CURRENT_TEST", None)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'inner'}",
            "tests/cli/test_hub.py::test_info_json",
            "tests/test_environment.py::test_callers_offline_token_and_threads_do_not_reach_the_tests",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 passed" in out.stdout
