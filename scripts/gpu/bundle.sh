#!/usr/bin/env bash
# Gathers what building aiacc needs that a bare GPU host lacks (it has Python torch with its CUDA
# LibTorch, nvcc, CMake and ninja, but no apt and no network): gflags, glog, GoogleTest, nlohmann-json,
# libjpeg-turbo, OpenCV core + imgproc and the libraries they load (X11 and the GCC runtime
# included: a bare image may lack them), Gloo (used only when the
# torch found there ships no Gloo headers of its own), all extracted from Debian 12 packages into
# one folder. Nothing is installed on this machine. Run here (it needs apt); carry the folder.
#   scripts/gpu/bundle.sh [DIR]        (default: gpu-bundle/, ignored by git)
# OpenCV's imgcodecs is left out on purpose: Debian's pulls in GDAL and GDCM (well over 100 MB);
# without it the build skips PNG-named-.JPEG and CMYK files with a counted warning instead of
# decoding them through OpenCV.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-gpu-bundle}
PKGS=(
  libgflags2.2 libgflags-dev
  libgoogle-glog0v6 libgoogle-glog-dev libunwind8 libunwind-dev
  libgtest-dev
  nlohmann-json3-dev
  libturbojpeg0 libturbojpeg0-dev libjpeg62-turbo libjpeg62-turbo-dev
  libopencv-core406 libopencv-core-dev libopencv-imgproc406 libopencv-imgproc-dev
  libtbb12 libblas3 liblapack3 libgfortran5 libquadmath0 libglx0 libglvnd0
  libx11-6 libxau6 libxdmcp6 libxcb1 libbsd0 libmd0
  libgloo0 libgloo-dev libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
)
command -v apt-get >/dev/null || { echo "bundle.sh: needs apt-get (run it on a Debian 12 machine)" >&2; exit 1; }
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT
if ! (cd "$CACHE" && apt-get download "${PKGS[@]}" >/dev/null 2>"$CACHE/err"); then
  # Package lists may be missing on a fresh machine.
  if [ "$(id -u)" -eq 0 ]; then apt-get update >/dev/null; else sudo apt-get update >/dev/null; fi
  (cd "$CACHE" && apt-get download "${PKGS[@]}" >/dev/null) || { cat "$CACHE/err" >&2; exit 1; }
fi
rm -rf "$OUT"
mkdir -p "$OUT"
for deb in "$CACHE"/*.deb; do dpkg-deb -x "$deb" "$OUT"; done
# Documentation, manuals and the OpenCV CMake files (they reference modules not carried) go.
rm -rf "$OUT/usr/share/doc" "$OUT/usr/share/man" "$OUT/usr/share/lintian" "$OUT/usr/lib/x86_64-linux-gnu/cmake/opencv4"
# OpenCV's static archives (20 MB) are not needed; the other packages' CMake configs name theirs.
find "$OUT" -name 'libopencv_*.a' -delete
# BLAS and LAPACK sit behind Debian's alternatives, which dpkg-deb -x does not set up.
LIB="$OUT/usr/lib/x86_64-linux-gnu"
ln -sf blas/libblas.so.3 "$LIB/libblas.so.3"
ln -sf lapack/liblapack.so.3 "$LIB/liblapack.so.3"
ls "$CACHE"/*.deb | xargs -n1 basename > "$OUT/PACKAGES"
echo "bundle.sh: ${#PKGS[@]} packages into $OUT ($(du -sh "$OUT" | cut -f1)); carry it to the GPU host beside scripts/gpu/check.sh"
