#!/usr/bin/env bash
# Runs the test suite in both build configurations: set up packages if needed, build, run every
# CTest test.
#   1. Debian's LibTorch 1.13 (CPU, with the system Gloo) in build/;
#   2. the pip LibTorch 2.11 with CUDA 13.0 (scripts/torch2.sh) in build-torch2/, C++20, without
#      GlooTransport (comm/CMakeLists.txt says why); its checkpoints are checked against build/'s
#      both ways (CheckpointCompat.AcrossBuilds).
# AIACC_CONFIGS="debian" (or "torch2") runs one; extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIGS=${AIACC_CONFIGS:-debian torch2}
scripts/setup.sh
t0=$SECONDS
for c in $CONFIGS; do
  case "$c" in
    debian)
      s=$SECONDS
      scripts/build.sh
      echo "test.sh: debian build: $((SECONDS - s)) s"
      (cd "${AIACC_BUILD_DIR:-build}" && ctest --output-on-failure -j "${AIACC_TEST_JOBS:-2}" --timeout 600 "$@")
      ;;
    torch2)
      s=$SECONDS
      peer=()
      [ -x build/tests/aiacc_checkpoint_tool ] && peer=(-DAIACC_PEER_BUILD_DIR="$PWD/build")
      AIACC_BUILD_DIR=build-torch2 scripts/build.sh --torch2 "${peer[@]}"
      echo "test.sh: torch2 build: $((SECONDS - s)) s"
      (cd build-torch2 && ctest --output-on-failure -j "${AIACC_TEST_JOBS:-2}" --timeout 600 "$@")
      ;;
    *) echo "test.sh: unknown configuration '$c' (debian, torch2)" >&2; exit 2 ;;
  esac
done
echo "test.sh: $CONFIGS passed in $((SECONDS - t0)) s"
