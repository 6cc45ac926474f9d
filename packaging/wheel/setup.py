"""Build hook: ship the top-level resources/ and icons/ inside the wheel as studio/_data/.

All project metadata lives in pyproject.toml; this file only adds the copy step, which no
pyproject.toml key can express (package-data cannot reach outside the package folder).
studio/paths.py finds the copies in an installed wheel and the originals in a checkout.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA = {"resources": ("screenshots",), "icons": ()}  # folder -> entries left out (README-only images)


class BuildPyWithData(build_py):
    """build_py that also copies DATA into <build_lib>/studio/_data/."""

    def run(self):
        super().run()
        for name, skip in DATA.items():
            dst = Path(self.build_lib) / "studio" / "_data" / name
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(ROOT / name, dst, ignore=shutil.ignore_patterns(*skip, "__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithData})
