#!/usr/bin/env bash
# Installs every system package aiacc needs to build, run and test, on Debian 12, and the pip
# LibTorch 2.x of the second build configuration (scripts/torch2.sh: torch==2.11.0 with CUDA
# 13.0 and its pinned requirements, into .venv-torch2/; AIACC_SKIP_TORCH2=1 skips it), and the
# tests' Python tools in every configuration (scripts/tools_venv.sh: a pinned tensorboard, whose
# reader checks aiacc's event files, into .venv-tools/).
# Idempotent: packages already present are left as they are. Needs root (or sudo).
set -euo pipefail

PKGS=(
  build-essential cmake ccache pkg-config
  ninja-build             # scripts/build.sh's generator where present
  libtorch-dev            # LibTorch 1.13 (CPU)
  libopenblas0-openmp     # BLAS behind libblas.so.3 (else netlib's reference BLAS: LibTorch 1.13 runs
                          # 1x1 convolutions with batch < 16 through it, 6.7x slower for ResNet-50)
  libgloo-dev             # CPU collectives (comm/)
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev  # decode fallback
  libturbojpeg0-dev libjpeg62-turbo-dev                            # primary decoder
  libgflags-dev libgoogle-glog-dev
  nlohmann-json3-dev      # JSON written and read (reports, metrics, timeline, args.json)
  libgtest-dev googletest
  python3 python3-torch python3-torchvision python3-numpy python3-pil  # golden tests, reference peers
  iproute2 procps
  clang-format            # clang-format 14: .clang-format, scripts/format_check.sh
  clang libclang-rt-14-dev  # the fuzz targets: clang's libFuzzer, ASan and UBSan (scripts/fuzz.sh)
  python3-venv            # the venv of the LibTorch 2.x configuration
  slurm-wlm munge openmpi-bin  # the real launchers of tests/slurm_test.cc (scripts/slurmlab.sh)
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
else
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi

"$(dirname "$0")/tools_venv.sh" > /tmp/aiacc-tools-setup.log 2>&1 || { cat /tmp/aiacc-tools-setup.log >&2; exit 1; }
tail -1 /tmp/aiacc-tools-setup.log

if [ "${AIACC_SKIP_TORCH2:-0}" != 1 ]; then
  "$(dirname "$0")/torch2.sh" > /tmp/aiacc-torch2-setup.log 2>&1 || { cat /tmp/aiacc-torch2-setup.log >&2; exit 1; }
  head -1 /tmp/aiacc-torch2-setup.log
fi
