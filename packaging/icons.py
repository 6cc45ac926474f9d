"""Render the app icon (icons/quant-studio.svg) to the sizes desktops and installers want.

    python packaging/icons.py OUT_DIR

writes OUT_DIR/hicolor/<N>x<N>/apps/io.quantstudio.QuantStudio.png for N in 16 … 512, the SVG as
OUT_DIR/hicolor/scalable/apps/io.quantstudio.QuantStudio.svg, and OUT_DIR/quant-studio.ico (Windows)
and quant-studio.icns (macOS) where Qt has a writer for them. Rendered with Qt's QSvgRenderer, so
nothing beyond PySide6 is needed. The PNGs are build outputs (packaging/build_bundle.sh makes them),
not files in the repository: the SVG is the one source.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

APP_ID = "io.quantstudio.QuantStudio"
SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
ROOT = Path(__file__).resolve().parents[1]


def render(svg: Path, out: Path) -> list[Path]:
    """Write every size of ``svg`` under ``out``; returns the files written."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QImageWriter, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg} is not a valid SVG file")
    written: list[Path] = []

    def image(n: int) -> QImage:
        img = QImage(n, n, QImage.Format.Format_ARGB32_Premultiplied)
        img.fill(Qt.GlobalColor.transparent)
        p = QPainter(img)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(p)
        p.end()
        return img

    for n in SIZES:
        target = out / "hicolor" / f"{n}x{n}" / "apps" / f"{APP_ID}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not image(n).save(str(target), "PNG"):
            raise SystemExit(f"could not write {target}")
        written.append(target)
    scalable = out / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"
    scalable.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(svg, scalable)
    written.append(scalable)
    formats = {bytes(f).decode() for f in QImageWriter.supportedImageFormats()}
    for fmt, size in (("ico", 256), ("icns", 512)):
        if fmt in formats:
            target = out / f"quant-studio.{fmt}"
            if image(size).save(str(target), fmt.upper()):
                written.append(target)
    return written


def main(argv: list[str]) -> int:
    """Command line: ``icons.py OUT_DIR``."""
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    files = render(ROOT / "icons" / "quant-studio.svg", Path(argv[0]))
    print(f"{len(files)} icon files in {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
