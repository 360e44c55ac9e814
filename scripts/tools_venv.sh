#!/usr/bin/env bash
# The Python tools the tests check aiacc's files with, apart from any torch: TensorBoard's own
# event file reader (scripts/tensorboard_check.py, run by tests/tensorboard_test.cc), pinned with
# every dependency, in .venv-tools/ (AIACC_TOOLS_VENV overrides; ignored by git). The tests find
# its python through the CMake cache variable AIACC_TOOLS_PYTHON (default .venv-tools/bin/python).
# Idempotent: a venv that already has every pinned version is kept. scripts/setup.sh runs it in
# every configuration (about 20 s and 180 MB the first time).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
VENV=${AIACC_TOOLS_VENV:-$root/.venv-tools}
# tensorboard and what pip resolves for it under Python 3.11 (setuptools: the venv's own).
PINS=(
  tensorboard==2.21.0 tensorboard-data-server==0.7.2 protobuf==7.36.2 numpy==2.4.6 grpcio==1.85.3
  absl-py==2.5.1 Markdown==3.11.3 MarkupSafe==3.0.4 packaging==26.4 pillow==13.0.0
  typing_extensions==4.16.0 Werkzeug==3.1.9
)
py=$VENV/bin/python

havePins() {
  "$py" - "${PINS[@]}" <<'EOF' 2>/dev/null
import sys
from importlib import metadata
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if metadata.version(name) != want:
            sys.exit(1)
    except metadata.PackageNotFoundError:
        sys.exit(1)
EOF
}

if [ -x "$py" ] && havePins; then
  echo "tools: tensorboard and its ${#PINS[@]} pinned packages already in $VENV"
  exit 0
fi
base=$(command -v python3.11 || command -v python3) || { echo "tools: no python3 to make a venv with" >&2; exit 1; }
t0=$SECONDS
echo "tools: installing ${PINS[0]} and its pinned dependencies into $VENV"
[ -x "$py" ] || "$base" -m venv "$VENV" || { echo "tools: cannot create a venv with $base (Debian: apt install python3-venv)" >&2; exit 1; }
"$py" -m pip install --no-input --disable-pip-version-check -q "${PINS[@]}" ||
  { echo "tools: pip could not install ${PINS[*]} (network? disk?)" >&2; exit 1; }
havePins || { echo "tools: $VENV does not hold the pinned versions after pip install" >&2; exit 1; }
echo "tools: installed in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1))"
