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
echo "aiacc: three passes with the defaults: the first builds the JPEG indexes along its decodes"
echo "(--jpeg-index-mb), the later ones use them (an epoch after the first, in training);"
echo "'no index': --jpeg-index-mb 0 (every pass alike); 'libjpeg huff.': also --libjpeg-huffman"
echo "(libjpeg-turbo's Huffman decoder instead of aiacc's)."
printf "%-6s %11s %11s %11s %13s %11s %8s %8s %9s %9s\n" size "aiacc later" "aiacc 1st" "no index" "libjpeg huff." torchvision ratio "1st r." "no-idx r." "libjpeg r."
ROUNDS=${ROUNDS:-5}
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v t="$2" 'BEGIN { printf "%.3f", a / t }'; }
rate() { sed -n 's/.* \([0-9.]*\) images\/s per worker.*/\1/p' | head -1; }
for S in 224 128; do
  # ROUNDS (5) interleaved rounds. This machine's speed drifts by 10-30% over seconds to minutes,
  # so each round's aiacc rates are divided by the torchvision rate measured right beside them,
  # and the ratios reported are the medians of those per-round ratios (the rates: medians too).
  ls=""; fs=""; ns=""; js=""; ts=""; rl=""; rf=""; rn=""; rj=""
  for k in $(seq 1 "$ROUNDS"); do
    run() { "$BIN/aiacc_bench" data --data "$DIR" --image-size "$S" --workers 1 --images $((IMAGES * 3)) --repeat 3 "$@"; }
    out=$(run)
    f=$(echo "$out" | sed -n 's/.*first pass ([^)]*) \([0-9.]*\) images\/s.*/\1/p')
    l=$(echo "$out" | sed -n 's/.*later passes (with them) \([0-9.]*\) images\/s.*/\1/p')
    t=$(/usr/bin/python3 scripts/bench_data.py "$DIR" "$S" "$IMAGES" | sed -n 's/.*: \([0-9.]*\) images\/s per thread/\1/p')
    n=$(run --jpeg-index-mb 0 | rate)
    j=$(run --jpeg-index-mb 0 --libjpeg-huffman | rate)
    ls="$ls $l"; fs="$fs $f"; ns="$ns $n"; js="$js $j"; ts="$ts $t"
    rl="$rl $(ratio "$l" "$t")"; rf="$rf $(ratio "$f" "$t")"; rn="$rn $(ratio "$n" "$t")"; rj="$rj $(ratio "$j" "$t")"
  done
  m() { echo $1 | median; }
  r2() { printf "%.2f" "$(m "$1")"; }
  printf "%-6s %11s %11s %11s %13s %11s %7sx %7sx %8sx %8sx\n" "$S" "$(m "$ls")" "$(m "$fs")" "$(m "$ns")" "$(m "$js")" \
    "$(m "$ts")" "$(r2 "$rl")" "$(r2 "$rf")" "$(r2 "$rn")" "$(r2 "$rj")"
  echo "       runs: later$ls; first$fs; no index$ns; libjpeg huffman$js; torchvision$ts"
  echo "       per-round ratios to torchvision: later$rl; first$rf; no index$rn; libjpeg huffman$rj"
  eval "ratio_$S=$(r2 "$rl"); first_$S=$(r2 "$rf"); noidx_$S=$(r2 "$rn"); libjpeg_$S=$(r2 "$rj")"
done
echo "headline: aiacc decodes+augments ${ratio_224}x torchvision per thread at 224, ${ratio_128}x at 128 (epochs after the first; first epoch ${first_224}x / ${first_128}x; without indexes ${noidx_224}x / ${noidx_128}x; without indexes and with libjpeg-turbo's Huffman decoder ${libjpeg_224}x / ${libjpeg_128}x)"
