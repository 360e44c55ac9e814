#!/usr/bin/env bash
# Data pipeline benchmark: aiacc_bench data beside torchvision (python3-torchvision) on the same
# JPEG files, one thread each, at 224 and 128 px; prints both rates and the ratio.
#   scripts/bench_data.sh [DIR] [IMAGES]
# Without DIR, generates a photo-sized JPEG set (bench_data/, 375..500 px sides) first.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${AIACC_BUILD_DIR:-build}/app
[ -x "$BIN/aiacc_bench" ] || scripts/build.sh
DIR=${1:-}
IMAGES=${2:-600}
if [ -z "$DIR" ]; then
  DIR=bench_data
  if [ ! -d "$DIR" ]; then
    "$BIN/aiacc_train" --make-sample "$DIR" --sample-classes 10 --sample-train-per-class 60 \
      --sample-val-per-class 1 --sample-min-side 375 --sample-max-side 500
  fi
fi
echo "data benchmark on $DIR ($IMAGES images per run, 1 thread each)"
printf "%-6s %14s %14s %8s\n" size aiacc/thread torchvision ratio
median() { tr ' ' '\n' | sort -g | sed -n 2p; }
for S in 224 128; do
  # Three interleaved runs of each side, medians compared: this machine's speed drifts by 10-20%
  # from second to second. aiacc is faster, so it makes three passes over the files per run and
  # both timings last a second or more.
  as=""; ts=""
  for k in 1 2 3; do
    as="$as $("$BIN/aiacc_bench" data --data "$DIR" --image-size "$S" --workers 1 --images $((IMAGES * 3)) --repeat 3 \
      | sed -n 's/.* \([0-9.]*\) images\/s per worker.*/\1/p')"
    ts="$ts $(/usr/bin/python3 scripts/bench_data.py "$DIR" "$S" "$IMAGES" | sed -n 's/.*: \([0-9.]*\) images\/s per thread/\1/p')"
  done
  a=$(echo $as | median); t=$(echo $ts | median)
  r=$(awk -v a="$a" -v t="$t" 'BEGIN { printf "%.2f", a / t }')
  printf "%-6s %14s %14s %7sx   (runs: aiacc%s; torchvision%s)\n" "$S" "$a" "$t" "$r" "$as" "$ts"
  eval "ratio_$S=$r"
done
echo "headline: aiacc decodes+augments ${ratio_224}x torchvision per thread at 224, ${ratio_128}x at 128"
