#!/usr/bin/env bash
# Run the PyInstaller bundle (packaging/build_bundle.sh) as a user would: copied out of the source
# tree, started from another folder under Xvfb, with a throw-away cache and settings.
#
#   packaging/check_bundle.sh [CHAT.gguf]     (default: the window chats with the demo's F16 export)
#   BUNDLE=dist/quant-studio  KEEP=1 (leave the work folder)  OUT=DIR (where the screenshot goes)
#
# 1. the window opens its demo model (quant-studio --demo --smoke-test): torch + transformers inside;
# 2. quant-studio-cli exports that model to Q8_0 (numba kernels inside the bundle) and to F16;
# 3. quant-studio-cli chat asks the demo question of the original (transformers) beside the F16 and
#    Q8_0 exports (and CHAT.gguf): llama.cpp runs in a spawned child, which in a frozen app re-runs
#    the executable (multiprocessing.freeze_support in packaging/pyinstaller/*.py). The original must
#    answer "... Paris." and the F16 file the same tokens; the Q8_0 file need only answer. (Its greedy
#    answer starts "L'Étoile" in the venv too: the original gives the right first token only 15 % vs
#    14 %, and llama.cpp's 8-bit activations tip that near-tie; tests/real checks F16 = original.)
# 4. the window opens CHAT.gguf (default: the F16 export), goes to the Chat page (Ctrl+7), the
#    question is typed and sent with xdotool, and OUT/bundle-chat.png is taken (look at it).
# Needs: xvfb-run, xdotool, ImageMagick's import (Debian: xvfb xdotool imagemagick libxcb-cursor0
# libxcb-icccm4 libxcb-keysyms1).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
BUNDLE=$(realpath "${BUNDLE:-dist/quant-studio}")
OUT=$(realpath -m "${OUT:-build/bundle}")
CHAT=${1:+$(realpath "$1")}
if [ -z "${_QS_IN_XVFB:-}" ]; then
  export _QS_IN_XVFB=1
  exec xvfb-run -a -s "-screen 0 1600x1000x24" "$0" "$@"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/qs-bundle-check.XXXXXX")
if [ -n "${KEEP:-}" ]; then echo "work folder: $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
step() { printf '\n== %s\n' "$*"; }

step "copy the bundle out of the source tree"
cp -a "$BUNDLE" "$WORK/app"
APP="$WORK/app"
echo "bundle $(du -sh "$BUNDLE" | cut -f1) ($(find "$APP" -type f | wc -l) files)"
mkdir -p "$WORK/elsewhere" "$OUT"
cd "$WORK/elsewhere"
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV
export PATH="/usr/bin:/bin" QT_QPA_PLATFORM=xcb QUANT_STUDIO_CACHE="$WORK/cache" HF_HOME="$WORK/hf" \
  XDG_CONFIG_HOME="$WORK/config" XDG_DATA_HOME="$WORK/data" HF_HUB_OFFLINE=1 QT_STYLE_OVERRIDE=Fusion

step "the window opens the demo model"
timeout 600 "$APP/quant-studio" --demo --smoke-test --settings "$WORK/s1.ini" 2>"$WORK/gui1.err" | tee "$WORK/gui1.json" \
  || { tail -20 "$WORK/gui1.err"; exit 1; }
grep -q '"ok": true' "$WORK/gui1.json"
case "$(cat "$WORK/gui1.json")" in *"$SRC"*) echo "the bundle used the source tree"; exit 1 ;; esac

step "quant-studio-cli exports the demo to Q8_0 and F16"
"$APP/quant-studio-cli" --version
DEMO=$("$APP/quant-studio-cli" demo --json | sed -n 's/.*"path": *"\([^"]*\)".*/\1/p')
"$APP/quant-studio-cli" export "$DEMO" -o "$WORK/demo-Q8_0.gguf" --preset Q8_0 --json >"$WORK/export.json"
"$APP/quant-studio-cli" export "$DEMO" -o "$WORK/demo-F16.gguf" --uniform F16 --json >"$WORK/export-f16.json"
ls -l "$WORK/demo-Q8_0.gguf" "$WORK/demo-F16.gguf"
CHAT=${CHAT:-$WORK/demo-F16.gguf}

QUESTION="What is the capital of France?"
step "quant-studio-cli asks the original, F16 and Q8_0 (llama.cpp in spawned children of the frozen app)"
compare=(--compare "$WORK/demo-F16.gguf" --compare "$WORK/demo-Q8_0.gguf")
[ "$CHAT" = "$WORK/demo-F16.gguf" ] || compare+=(--compare "$CHAT")
timeout 600 "$APP/quant-studio-cli" chat --model "$DEMO" "${compare[@]}" --prompt "$QUESTION" \
  --max-tokens 24 --json >"$WORK/chat.json"
python3 - "$WORK/chat.json" <<'PY'
import json, sys
original, f16, *others = json.load(open(sys.argv[1]))["models"]
for row in (original, f16, *others):
    print(f"{row['label']}: {row['text']!r} (first divergence: {row['first_divergence']})")
    assert not row.get("error") and row["text"].strip(), row
assert "Paris" in original["text"], f"the original does not answer Paris: {original['text']!r}"
assert f16["first_divergence"] is None and f16["text"] == original["text"], "the F16 file answers differently"
print("the original answers Paris and the F16 GGUF gives the same tokens")
PY
step "the window chats with $(basename "$CHAT")"
"$APP/quant-studio" "$CHAT" --size 1400x900 --settings "$WORK/s2.ini" 2>"$WORK/gui2.err" &
GUI=$!
wid=""
for _ in $(seq 120); do
  wid=$(xdotool search --onlyvisible --name "$(basename "$CHAT" .gguf).*Quant Studio" 2>/dev/null | head -1) && [ -n "$wid" ] && break
  sleep 1
done
[ -n "$wid" ] || { echo "the window did not show the model"; tail "$WORK/gui2.err"; kill $GUI; exit 1; }
sleep 3
eval "$(xdotool getwindowgeometry --shell "$wid")"
xdotool windowactivate --sync "$wid" 2>/dev/null || xdotool windowfocus --sync "$wid"
xdotool key --window "$wid" ctrl+7
sleep 3
# Where the message box and Send sit on the Chat page of a fresh 1400x900 window (fresh settings,
# default dock layout); Qt widgets are no X windows, so they are clicked by position.
xdotool mousemove --window "$wid" $((WIDTH * 60 / 100)) $((HEIGHT * 61 / 100)) click 1
xdotool type --delay 20 "$QUESTION"
sleep 1
xdotool mousemove --window "$wid" $((WIDTH * 964 / 1000)) $((HEIGHT * 587 / 1000)) click 1
sleep 3
echo "children of the window (llama.cpp runs in a spawned copy of the executable):"
ps --ppid "$GUI" -o pid=,args= | cut -c1-160 || true
# The reply streams in: wait (at most 3 min) until two screenshots 3 s apart are the same.
import -window root "$WORK/shot0.png"
for _ in $(seq 60); do
  sleep 3
  import -window root "$WORK/shot1.png"
  same=$(compare -metric AE "$WORK/shot0.png" "$WORK/shot1.png" null: 2>&1 || true)
  [ "${same%% *}" = 0 ] && break
  mv "$WORK/shot1.png" "$WORK/shot0.png"
done
import -window root "$OUT/bundle-chat.png"
kill $GUI 2>/dev/null || true
wait $GUI 2>/dev/null || true
echo "screenshot: $OUT/bundle-chat.png"
echo
echo "bundle check finished"
