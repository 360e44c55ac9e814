#!/usr/bin/env bash
# The comm-only configuration (-DAIACC_COMM_ONLY=ON) needs LibTorch alone among aiacc's
# dependencies (with Gloo where aiacc links the system's, and the header-only nlohmann-json):
#   1. it configures with gflags, glog and libjpeg-turbo made unfindable
#      (CMAKE_DISABLE_FIND_PACKAGE_*), never looks for OpenCV, and generates aiacc_comm and
#      aiacc_comm_shared and none of the data pipeline's or the trainer's targets;
#   2. the full configuration, with the same packages unfindable, fails (so step 1 proves
#      something).
# TORCH_PREFIX: the LibTorch's prefix, for CMAKE_PREFIX_PATH ("-": a system LibTorch).
# Usage: comm_only_test.sh SOURCE_DIR WORK_DIR TORCH_PREFIX|- [cmake args for find_package(Torch)...]
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 SOURCE_DIR WORK_DIR TORCH_PREFIX|- [cmake args...]" >&2; exit 2; }
src=$1 work=$2 torch_prefix=$3
shift 3
[ "$torch_prefix" != - ] && set -- -DCMAKE_PREFIX_PATH="$torch_prefix" "$@"
fail() { echo "comm_only_test: FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
hide=(-DCMAKE_DISABLE_FIND_PACKAGE_gflags=ON -DCMAKE_DISABLE_FIND_PACKAGE_glog=ON
      -DCMAKE_DISABLE_FIND_PACKAGE_libjpeg-turbo=ON -DAIACC_BUILD_TESTS=OFF)

# 1.
cmake -S "$src" -B "$work/comm" -DAIACC_COMM_ONLY=ON "${hide[@]}" "$@" > "$work/comm.log" 2>&1 ||
  { cat "$work/comm.log"; fail "the comm-only configuration needs more than LibTorch"; }
grep -q '^OPENCV' "$work/comm/CMakeCache.txt" && fail "the comm-only configuration looked for OpenCV"
targets=$(cmake --build "$work/comm" --target help)
for t in aiacc_comm aiacc_comm_shared; do
  grep -qw "$t" <<< "$targets" || fail "the comm-only configuration has no $t target"
done
for t in aiacc_data aiacc_models aiacc_app aiacc_train; do
  grep -qw "$t" <<< "$targets" && fail "the comm-only configuration builds $t"
done

# 2.
if cmake -S "$src" -B "$work/full" "${hide[@]}" "$@" > "$work/full.log" 2>&1; then
  fail "the full configuration succeeded without gflags, glog and libjpeg-turbo: step 1 shows nothing"
fi
grep -q 'find_package for module libjpeg-turbo' "$work/full.log" || { cat "$work/full.log"; fail "the full configuration failed for another reason"; }
echo "comm_only_test: the comm-only configuration needs none of gflags, glog, libjpeg-turbo, OpenCV; the full one stops at: $(grep -o 'find_package for module [A-Za-z_-]*' "$work/full.log" | sed 's/.* //' | tr '\n' ' ')"
echo "comm_only_test: passed"
