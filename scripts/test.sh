#!/usr/bin/env bash
# Runs the test suite: set up packages if needed, build, run every CTest test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd "${AIACC_BUILD_DIR:-build}"
ctest --output-on-failure -j "${AIACC_TEST_JOBS:-2}" --timeout 600 "$@"
