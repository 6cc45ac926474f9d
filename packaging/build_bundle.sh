#!/usr/bin/env bash
# Build the PyInstaller one-folder bundle: dist/quant-studio/ with `quant-studio` (window) and
# `quant-studio-cli`, their shared libraries under _internal/, and share/ for Linux desktops
# (the .desktop file, AppStream metainfo, icons 16-512 px and scalable).
#
#   bash packaging/build_bundle.sh            PYTHON=... picks the environment (default .venv/bin/python)
#
# Slow (many minutes: torch, PySide6 and transformers are analysed), so it is not part of .ci/run;
# packaging/check_bundle.sh then runs the result from another folder under Xvfb.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -c "import PyInstaller" 2>/dev/null || "$PY" -m pip install -q "pyinstaller>=6.10"
# The checkout's studio (not an installed copy) is what gets analysed and bundled.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
BUILD=build/bundle
rm -rf "$BUILD" dist/quant-studio
mkdir -p "$BUILD"

"$PY" packaging/icons.py "$BUILD/icons"
QS_ICON_DIR="$PWD/$BUILD/icons" "$PY" -m PyInstaller --noconfirm --clean \
  --workpath "$BUILD/work" --distpath dist packaging/pyinstaller/quant-studio.spec

if [ "$(uname -s)" = Linux ]; then
  share=dist/quant-studio/share
  install -Dm644 packaging/linux/io.quantstudio.QuantStudio.desktop "$share/applications/io.quantstudio.QuantStudio.desktop"
  install -Dm644 packaging/linux/io.quantstudio.QuantStudio.metainfo.xml "$share/metainfo/io.quantstudio.QuantStudio.metainfo.xml"
  mkdir -p "$share/icons" && cp -r "$BUILD/icons/hicolor" "$share/icons/"
fi
echo "bundle: dist/quant-studio ($(du -sh dist/quant-studio | cut -f1))"
