#!/usr/bin/env bash
# Reproduce the README screenshots under Xvfb: resources/screenshots/main-window.png.
#
#   packaging/screenshots.sh [MODEL]     (default: the offline demo model, as `quant-studio --demo`)
#
# Needs: xvfb-run, xdotool, ImageMagick's `import` (Debian: apt-get install xvfb xdotool imagemagick
# libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1). Settings go to a throw-away file, not the user's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=resources/screenshots
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
MODEL=${1:-}

if [ -z "${_QS_IN_XVFB:-}" ]; then
  export _QS_IN_XVFB=1
  exec xvfb-run -a -s "-screen 0 1600x1000x24" "$0" "$@"
fi

export QT_QPA_PLATFORM=xcb
# The demo is built from scratch in a throw-away cache, exactly as on a newcomer's first start.
export QUANT_STUDIO_CACHE="$WORK/cache"
# A neutral, reproducible look: Fusion style, no desktop theme, fixed font size.
export QT_STYLE_OVERRIDE=Fusion QT_QPA_PLATFORMTHEME= QT_FONT_DPI=96
ARGS=(--settings "$WORK/settings.ini" --size 1600x1000 --select "${SELECT:-model.layers.1.mlp.down_proj.weight}")
if [ -n "$MODEL" ]; then ARGS+=("$MODEL"); else ARGS+=(--demo); fi

"$PY" -m studio.app "${ARGS[@]}" &
APP=$!
# The title names the model once it is open; then give the estimates a moment to fill in.
if ! timeout 120 xdotool search --sync --limit 1 --name " — Quant Studio" >/dev/null; then
  echo "the window never showed a model" >&2; kill "$APP"; exit 1
fi
WID=$(xdotool search --limit 1 --name " — Quant Studio")
xdotool windowmove "$WID" 0 0 windowsize "$WID" 1600 1000
sleep 2
import -window root -depth 8 "$WORK/main-window.png"
kill "$APP"
wait "$APP" 2>/dev/null || true
# Palette-reduce so the PNG stays small (< 300 KB) without visible loss on flat UI colours.
convert "$WORK/main-window.png" -colors 192 -strip "PNG8:$OUT/main-window.png"
ls -l "$OUT/main-window.png"
