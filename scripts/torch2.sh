#!/usr/bin/env bash
# The LibTorch 2.x configuration, one definition for CI (scripts/setup.sh, build.sh, test.sh)
# and the GPU check (scripts/gpu/check.sh). Source it, then call:
#   torch2_install            the pinned wheel (torch==$AIACC_TORCH2_VERSION, CUDA 13.0) and its exact
#                             requirements into $AIACC_TORCH2_VENV (default .venv-torch2/, ignored by
#                             git); idempotent: a venv that already has that torch is kept
#   torch2_site [PYTHON]      the site-packages folder holding torch (default: the venv's python)
#   torch2_cmake_args SITE [PYTHON]
#                             cmake arguments for a build against SITE/torch: its share/cmake, the
#                             CUDA toolkit ($CUDA_HOME, default /usr/local/cuda), TORCH_CUDA_ARCH_LIST
#                             (default 9.0, the H200), C++20 (torch 2.14 and later refuse C++17), and
#                             the Python whose torch/torchvision make the tests' golden values
#                             (default: the venv's)
#   torch2_facts SITE         what the wheel is: Gloo headers or not, gloo symbols exported from
#                             libtorch_cpu, NEEDED and RPATH of libtorch_cuda, its Requires-Dist
# Run directly, it does torch2_install and prints the facts.

AIACC_TORCH2_VERSION=${AIACC_TORCH2_VERSION:-2.11.0}
# torchvision of the same release: the golden source of the tests in this configuration (as
# Debian's python3-torchvision is for the 1.13 one), never a dependency of aiacc_train.
AIACC_TORCHVISION_VERSION=${AIACC_TORCHVISION_VERSION:-0.26.0}
_torch2_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AIACC_TORCH2_VENV=${AIACC_TORCH2_VENV:-$_torch2_root/.venv-torch2}

torch2_site() {
  local py=${1:-$AIACC_TORCH2_VENV/bin/python}
  "$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null
}

torch2_install() {
  local py=$AIACC_TORCH2_VENV/bin/python have
  have=$("$py" -c 'import torch, torchvision; print(torch.__version__.split("+")[0], torchvision.__version__.split("+")[0])' 2>/dev/null || true)
  if [ "$have" = "$AIACC_TORCH2_VERSION $AIACC_TORCHVISION_VERSION" ]; then
    echo "torch2: torch and torchvision $have already in $AIACC_TORCH2_VENV"
    return 0
  fi
  local base
  base=$(command -v python3.11 || command -v python3) || { echo "torch2: no python3 to make a venv with" >&2; return 1; }
  echo "torch2: installing torch==$AIACC_TORCH2_VERSION (CUDA 13.0 wheel and its pinned nvidia/cuda requirements) into $AIACC_TORCH2_VENV"
  local t0=$SECONDS
  [ -x "$py" ] || "$base" -m venv "$AIACC_TORCH2_VENV" || { echo "torch2: cannot create a venv with $base" >&2; return 1; }
  "$py" -m pip install --no-input --disable-pip-version-check -q "torch==$AIACC_TORCH2_VERSION" \
      "torchvision==$AIACC_TORCHVISION_VERSION" ||
    { echo "torch2: pip could not install torch==$AIACC_TORCH2_VERSION torchvision==$AIACC_TORCHVISION_VERSION (network? disk?)" >&2; return 1; }
  echo "torch2: installed in $((SECONDS - t0)) s ($(du -sh "$AIACC_TORCH2_VENV" | cut -f1))"
}

torch2_cmake_args() {
  local site=$1 py=${2:-$AIACC_TORCH2_VENV/bin/python} cuda=${CUDA_HOME:-/usr/local/cuda}
  local args=(-DCMAKE_PREFIX_PATH="$site/torch" -DAIACC_CXX_STANDARD=20
              -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}")
  [ -x "$py" ] && args+=(-DAIACC_GOLDEN_PYTHON="$py")
  if [ -x "$cuda/bin/nvcc" ]; then
    args+=(-DCUDAToolkit_ROOT="$cuda" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc")
  fi
  printf '%s\n' "${args[@]}"
}

torch2_facts() {
  local site=$1 lib=$1/torch/lib
  echo "torch: $(grep -m1 '^Version:' "$site"/torch-*.dist-info/METADATA 2>/dev/null | cut -d' ' -f2) at $site/torch"
  if [ -f "$site/torch/include/gloo/context.h" ]; then echo "Gloo headers: shipped (torch/include/gloo)"; else
    echo "Gloo headers: not shipped"; fi
  echo "gloo:: symbols exported by libtorch_cpu.so: $(nm -D --defined-only "$lib/libtorch_cpu.so" 2>/dev/null | grep -c ' _ZN4gloo')"
  if [ -f "$lib/libtorch_cuda.so" ]; then
    echo "libtorch_cuda.so NEEDED: $(readelf -d "$lib/libtorch_cuda.so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    echo "libtorch_cuda.so RPATH: $(readelf -d "$lib/libtorch_cuda.so" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')"
  else
    echo "libtorch_cuda.so: absent (a CPU wheel)"
  fi
  echo "Requires-Dist:"
  grep '^Requires-Dist:' "$site"/torch-*.dist-info/METADATA 2>/dev/null | grep -v 'extra ==' | sed 's/^Requires-Dist: /  /'
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  torch2_install
  torch2_facts "$(torch2_site)"
fi
