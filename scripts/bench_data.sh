#!/usr/bin/env bash
# Data pipeline benchmark: aiacc_bench data beside torchvision (python3-torchvision) on the same
# JPEG files, one thread each, at 224 and 128 px; prints both rates and the ratio.
#   scripts/bench_data.sh [DIR] [IMAGES]      (ROUNDS=N: interleaved runs per side, default 5)
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
echo "data benchmark on $DIR ($IMAGES images per pass, 1 thread each)"
echo "aiacc runs three passes over the files: the first builds the JPEG entropy indexes (--jpeg-index-mb),"
echo "the later ones use them (an epoch after the first, in training); 'no index' is --jpeg-index-mb 0."
printf "%-6s %14s %14s %14s %12s %8s %10s %10s\n" size "aiacc later" "aiacc 1st" "aiacc no-idx" torchvision ratio "1st ratio" "no-idx r."
ROUNDS=${ROUNDS:-5}
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for S in 224 128; do
  # ROUNDS (5) interleaved runs of each, medians compared: this machine's speed drifts by 10-20%
  # from second to second.
  ls=""; fs=""; ns=""; ts=""
  for k in $(seq 1 "$ROUNDS"); do
    out=$("$BIN/aiacc_bench" data --data "$DIR" --image-size "$S" --workers 1 --images $((IMAGES * 3)) --repeat 3)
    fs="$fs $(echo "$out" | sed -n 's/.*first pass ([^)]*) \([0-9.]*\) images\/s.*/\1/p')"
    ls="$ls $(echo "$out" | sed -n 's/.*later passes (with them) \([0-9.]*\) images\/s.*/\1/p')"
    ns="$ns $("$BIN/aiacc_bench" data --data "$DIR" --image-size "$S" --workers 1 --images $((IMAGES * 3)) --repeat 3 --jpeg-index-mb 0 \
      | sed -n 's/.* \([0-9.]*\) images\/s per worker.*/\1/p')"
    ts="$ts $(/usr/bin/python3 scripts/bench_data.py "$DIR" "$S" "$IMAGES" | sed -n 's/.*: \([0-9.]*\) images\/s per thread/\1/p')"
  done
  l=$(echo $ls | median); f=$(echo $fs | median); n=$(echo $ns | median); t=$(echo $ts | median)
  r=$(awk -v a="$l" -v t="$t" 'BEGIN { printf "%.2f", a / t }')
  rf=$(awk -v a="$f" -v t="$t" 'BEGIN { printf "%.2f", a / t }')
  rn=$(awk -v a="$n" -v t="$t" 'BEGIN { printf "%.2f", a / t }')
  printf "%-6s %14s %14s %14s %12s %7sx %9sx %9sx\n" "$S" "$l" "$f" "$n" "$t" "$r" "$rf" "$rn"
  echo "       runs: later$ls; first$fs; no index$ns; torchvision$ts"
  eval "ratio_$S=$r; first_$S=$rf; noidx_$S=$rn"
done
echo "headline: aiacc decodes+augments ${ratio_224}x torchvision per thread at 224, ${ratio_128}x at 128 (epochs after the first; first epoch ${first_224}x / ${first_128}x; without indexes ${noidx_224}x / ${noidx_128}x)"
