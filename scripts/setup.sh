#!/usr/bin/env bash
# Installs every system package aiacc needs to build, run and test, on Debian 12.
# Idempotent: packages already present are left as they are. Needs root (or sudo).
set -euo pipefail

PKGS=(
  build-essential cmake ccache pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU)
  libopenblas0-openmp     # BLAS behind libblas.so.3 (else netlib's reference BLAS: LibTorch 1.13 runs
                          # 1x1 convolutions with batch < 16 through it, 6.7x slower for ResNet-50)
  libgloo-dev             # CPU collectives (comm/)
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev  # decode fallback
  libturbojpeg0-dev libjpeg62-turbo-dev                            # primary decoder
  libgflags-dev libgoogle-glog-dev
  libgtest-dev googletest
  python3 python3-torch python3-torchvision python3-numpy python3-pil  # golden tests, reference peers
  iproute2 procps
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup.sh: needs root (or sudo) to install packages" >&2; exit 1; fi
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#PKGS[@]} packages already installed"
  exit 0
fi

echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${missing[@]}"
