"""The app's SVG icons, shipped as ``studio._icons``; look them up with ``studio.paths.icon_path``."""
