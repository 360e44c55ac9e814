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
echo "aiacc: three passes with the defaults (aiacc's Huffman decoder, no JPEG indexes), every pass alike;"
echo "with --jpeg-index-mb: the first pass builds the indexes along its decodes, the later ones use them."
echo "'libjpeg huff.': aiacc with --libjpeg-huffman (libjpeg-turbo's Huffman decoder instead of aiacc's)."
printf "%-6s %10s %14s %12s %12s %12s %8s %10s %10s %10s\n" size aiacc "libjpeg huff." "idx 1st" "idx later" torchvision ratio "libjpeg r." "idx 1st r." "idx later"
ROUNDS=${ROUNDS:-5}
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v t="$2" 'BEGIN { printf "%.3f", a / t }'; }
for S in 224 128; do
  # ROUNDS (5) interleaved rounds. This machine's speed drifts by 10-30% over seconds to minutes,
  # so each round's aiacc rates are divided by the torchvision rate measured right beside them,
  # and the ratios reported are the medians of those per-round ratios (the rates: medians too).
  as=""; js=""; fs=""; ls=""; ts=""; ra=""; rj=""; rf=""; rl=""
  for k in $(seq 1 "$ROUNDS"); do
    a=$("$BIN/aiacc_bench" data --data "$DIR" --image-size "$S" --workers 1 --images $((IMAGES * 3)) --repeat 3 \
      | sed -n 's/.* \([0-9.]*\) images\/s per worker.*/\1/p')
    t=$(/usr/bin/python3 scripts/bench_data.py "$DIR" "$S" "$IMAGES" | sed -n 's/.*: \([0-9.]*\) images\/s per thread/\1/p')
    j=$("$BIN/aiacc_bench" data --data "$DIR" --image-size "$S" --workers 1 --images $((IMAGES * 3)) --repeat 3 \
      --libjpeg-huffman | sed -n 's/.* \([0-9.]*\) images\/s per worker.*/\1/p')
    out=$("$BIN/aiacc_bench" data --data "$DIR" --image-size "$S" --workers 1 --images $((IMAGES * 3)) --repeat 3 --jpeg-index-mb 1024)
    f=$(echo "$out" | sed -n 's/.*first pass ([^)]*) \([0-9.]*\) images\/s.*/\1/p')
    l=$(echo "$out" | sed -n 's/.*later passes (with them) \([0-9.]*\) images\/s.*/\1/p')
    as="$as $a"; ts="$ts $t"; js="$js $j"; fs="$fs $f"; ls="$ls $l"
    ra="$ra $(ratio "$a" "$t")"; rj="$rj $(ratio "$j" "$t")"; rf="$rf $(ratio "$f" "$t")"; rl="$rl $(ratio "$l" "$t")"
  done
  m() { echo $1 | median; }
  r=$(printf "%.2f" "$(m "$ra")")
  printf "%-6s %10s %14s %12s %12s %12s %7sx %9.2fx %9.2fx %9.2fx\n" "$S" "$(m "$as")" "$(m "$js")" "$(m "$fs")" "$(m "$ls")" \
    "$(m "$ts")" "$r" "$(m "$rj")" "$(m "$rf")" "$(m "$rl")"
  echo "       runs: aiacc$as; libjpeg huffman$js; index first pass$fs; index later$ls; torchvision$ts"
  echo "       per-round ratios to torchvision: aiacc$ra; libjpeg huffman$rj; index first pass$rf; index later$rl"
  eval "ratio_$S=$r; libjpeg_$S=$(printf "%.2f" "$(m "$rj")"); first_$S=$(printf "%.2f" "$(m "$rf")"); later_$S=$(printf "%.2f" "$(m "$rl")")"
done
echo "headline: aiacc decodes+augments ${ratio_224}x torchvision per thread at 224, ${ratio_128}x at 128 (every pass; with libjpeg-turbo's Huffman decoder ${libjpeg_224}x / ${libjpeg_128}x; with JPEG indexes: first pass ${first_224}x / ${first_128}x, later passes ${later_224}x / ${later_128}x)"
