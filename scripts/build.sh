#!/usr/bin/env bash
# Configures and builds aiacc in build/ (Release). Extra arguments go to cmake's configure step,
# e.g. -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${AIACC_BUILD_DIR:-build}
JOBS=${AIACC_JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
