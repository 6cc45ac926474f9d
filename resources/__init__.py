"""Data files of Quant Studio (sample texts, calibration text, ...), shipped as ``studio._resources``.

This file only makes the folder a package, so that pyproject.toml can map it into ``studio`` and
``importlib.resources`` can read it in every install; look files up with ``studio.paths.resource_path``.
"""
