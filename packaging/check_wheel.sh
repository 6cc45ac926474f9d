#!/usr/bin/env bash
# Build a wheel of this checkout in a temp folder and check that resources/ and icons/ ship inside it
# (as studio/_data/) and that studio.paths finds them from an installed copy, outside the checkout.
#
#   packaging/check_wheel.sh          (uses .venv/bin/python to build; nothing in the checkout changes)
#
# Until the lead copies packaging/wheel/setup.py and MANIFEST.in to the repository root, the temp copy
# gets them from packaging/wheel/, so the check shows what the proposal produces.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

git ls-files -co --exclude-standard | grep -v '^\.venv/' | tar -cf - -T - | tar -xf - -C "$WORK"
mkdir -p "$WORK/src" && (cd "$WORK" && find . -mindepth 1 -maxdepth 1 ! -name src -exec mv {} src/ \;)
[ -f "$WORK/src/setup.py" ] || cp packaging/wheel/setup.py "$WORK/src/setup.py"
[ -f "$WORK/src/MANIFEST.in" ] || cp packaging/wheel/MANIFEST.in "$WORK/src/MANIFEST.in"

"$PY" -m pip wheel -q --no-deps --no-build-isolation "$WORK/src" -w "$WORK/whl" 2> "$WORK/build.log" \
  || { cat "$WORK/build.log"; exit 1; }
WHEEL=$(ls "$WORK"/whl/*.whl)
echo "built $(basename "$WHEEL")"
"$PY" - "$WHEEL" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["studio/paths.py", "studio/_data/icons/quant-studio.svg", "studio/_data/resources/text/multilingual.txt"]
missing = [n for n in need if n not in names]
assert not missing, f"missing from the wheel: {missing}"
assert not any(n.startswith("studio/_data/resources/screenshots/") for n in names), "screenshots shipped"
assert not any(n.startswith(("resources/", "icons/", "tests/")) for n in names), "stray top-level folders"
print("wheel holds", sum(n.startswith("studio/_data/") for n in names), "data files")
PY

# Install it without dependencies into a bare venv and ask studio.paths from another directory.
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --no-deps "$WHEEL"
(cd "$WORK" && "$WORK/venv/bin/python" - <<'PY'
from studio.paths import icon_path, resource_path
r, i = resource_path("text", "multilingual.txt"), icon_path("quant-studio")
assert "site-packages" in str(r) and r.is_file(), r
assert "site-packages" in str(i) and i.is_file(), i
print("installed wheel finds", r.name, "and", i.name)
PY
)
echo "wheel check passed"
