#!/usr/bin/env bash
# Configures and builds aiacc (Release).
#   scripts/build.sh [cmake args...]            Debian's LibTorch 1.13 (CPU) in build/
#   scripts/build.sh --torch2 [cmake args...]   the pip LibTorch 2.x (CUDA) of scripts/torch2.sh in
#                                               build-torch2/, as C++20 (scripts/setup.sh installs it)
# Another LibTorch: scripts/build.sh -DCMAKE_PREFIX_PATH=/path/to/libtorch (the zip) or
# -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))').
# AIACC_BUILD_DIR overrides the folder, AIACC_JOBS the parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${AIACC_JOBS:-$(nproc)}
ARGS=()
if [ "${1:-}" = "--torch2" ]; then
  shift
  source scripts/torch2.sh
  site=$(torch2_site) || { echo "build.sh: no torch in $AIACC_TORCH2_VENV: run scripts/setup.sh (or scripts/torch2.sh)" >&2; exit 1; }
  mapfile -t ARGS < <(torch2_cmake_args "$site")
  BUILD_DIR=${AIACC_BUILD_DIR:-build-torch2}
  export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
else
  BUILD_DIR=${AIACC_BUILD_DIR:-build}
fi
# Ninja where installed (scripts/setup.sh installs it) for a new build folder: it compiles a
# target's unit while the libraries it links are still building, which Make's per-target order
# does not; an existing folder keeps the generator it was made with.
GEN=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja > /dev/null; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] || [ $# -gt 0 ] || [ ${#ARGS[@]} -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${ARGS[@]}" "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
