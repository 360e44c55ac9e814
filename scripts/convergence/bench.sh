#!/usr/bin/env bash
# Convergence benchmark: aiacc_train and the PyTorch reference (scripts/convergence/torch_ref.py,
# torchvision's ResNet, ImageFolder and transforms) on the same real image dataset with the same
# recipe, several seeds each, run interleaved (seed by seed) so the host's drift hits all sides
# alike. Prints top-1 per epoch (median over seeds, every seed, and the rank-sum p-value against
# PyTorch's seeds), seconds per epoch, and the median time to a target top-1 over all seeds (a seed
# that never reaches it counts as infinitely late) with its ratio to PyTorch's (report.py).
#
# Usage: scripts/convergence/bench.sh [--data DIR] [--seeds "0 1 2"] [--epochs 6] [--target 70]
#                                     [--scale N] [--sides "aiacc fast torch"] [--out DIR]
#   --data DIR   an ImageNet-layout folder; default: OpenCV's handwritten digits (digits.png in
#                Debian's opencv-doc, installed when missing) cut into a JPEG tree by make_digits.py
#   --scale N    digits upscaled N times (default 3: 60 px images, so the 32 px recipe shrinks its
#                crops as it would a photo's; 1 keeps them 20 px, upscaled by the recipe instead)
#   --sides      which runs: aiacc (default flags), fast (aiacc --resize fast, its resize before it
#                matched torchvision's), dct (aiacc --resize dct), torch (the PyTorch reference)
# The recipe (issue 19's): resnet18 at 32 px, batch 64, lr 0.4 per 256, cosine, no warmup, Nesterov
# momentum 0.9, weight decay 5e-5 off BN and biases, label smoothing 0.1, random-resized-crop scale
# 0.35-1, flip; val Resize(32/0.875) + CenterCrop(32). 2 compute threads and 1 decode worker each.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA="" SEEDS="0 1 2" EPOCHS=6 TARGET=70 SCALE=3 SIDES="aiacc fast torch" OUT=runs/convergence
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --scale) SCALE=$2; shift 2 ;;
    --sides) SIDES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
[ -x build/app/aiacc_train ] || scripts/build.sh
if [ -z "$DATA" ]; then
  DIGITS=/usr/share/doc/opencv-doc/examples/data/digits.png
  if [ ! -f "$DIGITS" ]; then
    echo "bench.sh: installing Debian's opencv-doc for digits.png"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get install -y --no-install-recommends opencv-doc >/dev/null
  fi
  DATA=convergence_data/digits_x$SCALE
  [ -d "$DATA/train" ] || $PY scripts/convergence/make_digits.py "$DATA" --scale "$SCALE"
fi
[ -d "$DATA/train" ] && [ -d "$DATA/val" ] || { echo "bench.sh: '$DATA' has no train/ and val/ folders" >&2; exit 2; }
mkdir -p "$OUT"
RECIPE=(--arch resnet18 --epochs "$EPOCHS" --image-size 32 --batch-size 64 --lr 0.4 --warmup-epochs 0 --nesterov
        --weight-decay 5e-5 --label-smoothing 0.1 --min-scale 0.35 --crop-fraction 0.875)
for seed in $SEEDS; do
  for side in $SIDES; do
    log="$OUT/$side.$seed.jsonl"
    echo "== seed $seed: $side"
    case "$side" in
      torch)
        $PY scripts/convergence/torch_ref.py --data "$DATA" --arch resnet18 --epochs "$EPOCHS" --image-size 32 \
          --batch-size 64 --lr 0.4 --warmup-epochs 0 --nesterov --weight-decay 5e-5 --label-smoothing 0.1 \
          --min-scale 0.35 --crop-fraction 0.875 --workers 1 --threads 2 --seed "$seed" > "$log" ;;
      aiacc|fast|dct)
        extra=(); [ "$side" != aiacc ] && extra=(--resize "$side")
        rm -f "$log"
        build/app/aiacc_train --data "$DATA" "${RECIPE[@]}" "${extra[@]}" --workers 1 --threads 2 --seed "$seed" \
          --metrics-file "$log" --progress-seconds 1000 > "$OUT/$side.$seed.log" 2>&1 ;;
      *) echo "bench.sh: unknown side '$side' (aiacc, fast, dct, torch)" >&2; exit 2 ;;
    esac
  done
done
$PY scripts/convergence/report.py --out "$OUT" --seeds "$SEEDS" --sides "$SIDES" --target "$TARGET"
