#!/usr/bin/env bash
# aiacc DataParallel beside PyTorch DDP (gloo), same model, batch, resolution, synthetic data and
# threads per rank, measured in one run on this machine (loopback). Prints images/s (aiacc: its
# steady rate, after warm-up and tuning), the ratio to DDP, scaling efficiency (N-process images/s
# over N x 1-process images/s) and the largest peak resident memory of any rank.
#   scripts/bench_ddp.sh [ARCH] [BATCH] [SIZE] [STEPS] [NPROC]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:-resnet18}; BATCH=${2:-32}; SIZE=${3:-64}; STEPS=${4:-30}; N=${5:-2}
BIN=${AIACC_BUILD_DIR:-build}/app/aiacc_train
[ -x "$BIN" ] || scripts/build.sh
THREADS=$(( $(nproc) / N )); [ "$THREADS" -ge 1 ] || THREADS=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

aiacc() {  # nproc extra-flags...
  local n=$1; shift
  "$BIN" --nproc "$n" --master 127.0.0.1:29671 --data synthetic --arch "$ARCH" --batch-size "$BATCH" \
    --image-size "$SIZE" --epochs 1 --warmup-epochs 0 --max-steps $((STEPS + 25)) --threads "$THREADS" \
    --synthetic-images $((BATCH * N * (STEPS + 30))) --report-file "$tmp/r.json" "$@" > "$tmp/log" 2>&1
  scripts/json_get.py "$tmp/r.json" steady_images_per_s %.1f
  scripts/json_get.py "$tmp/r.json" max_peak_rss_mb_over_ranks %.0f > "$tmp/rss.aiacc"
}
ddp() {  # nproc [fp16]
  local n=$1; shift
  local pids=()
  for r in $(seq 0 $((n - 1))); do
    RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=29672 \
      /usr/bin/python3 scripts/ddp_peer.py "$ARCH" "$BATCH" "$SIZE" "$STEPS" "$THREADS" "$@" > "$tmp/ddp$r" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  sed -n 's/ddp: \([0-9.]*\) images\/s/\1/p' "$tmp/ddp0"
  sed -n 's/ddp-rss: \([0-9.]*\) MiB/\1/p' "$tmp/ddp0" > "$tmp/rss.ddp"
}

echo "$ARCH batch $BATCH @ $SIZE px, synthetic, $THREADS thread(s) per rank, $STEPS timed steps"
a1=$(aiacc 1); d1=$(ddp 1)
P="--noautotune --streams 1"  # plain: one channel, fixed 25 MiB buckets
aN=$(aiacc "$N" $P); rssA=$(cat "$tmp/rss.aiacc"); aT=$(aiacc "$N")
aH=$(aiacc "$N" $P --allreduce-dtype fp16)
aS=$(aiacc "$N" --noautotune --streams 2); dN=$(ddp "$N"); rssD=$(cat "$tmp/rss.ddp"); dH=$(ddp "$N" fp16)
row() { printf "%-40s %10s %8s\n" "$1" "$2" "$3"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
eff() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.0f%%", 100 * a / (n * b) }'; }
row "configuration" "images/s" "vs DDP"
row "PyTorch DDP, 1 process" "$d1" "1.00x"
row "aiacc, 1 process" "$a1" "$(ratio "$a1" "$d1")"
row "PyTorch DDP fp32, $N processes" "$dN" "1.00x"
row "PyTorch DDP fp16 hook, $N processes" "$dH" "$(ratio "$dH" "$dN")"
row "aiacc, $N processes" "$aN" "$(ratio "$aN" "$dN")"
row "aiacc with autotune, $N processes" "$aT" "$(ratio "$aT" "$dN")"
row "aiacc --allreduce-dtype fp16, $N proc" "$aH" "$(ratio "$aH" "$dN")   ($(ratio "$aH" "$dH") DDP fp16)"
row "aiacc --streams 2, $N proc" "$aS" "$(ratio "$aS" "$dN")"
echo "scaling efficiency: aiacc $(eff "$aN" "$a1" "$N"), PyTorch DDP $(eff "$dN" "$d1" "$N")"
echo "peak resident memory, largest rank: aiacc $rssA MiB, PyTorch DDP $rssD MiB ($N processes)"
echo "headline: aiacc $N-process $(ratio "$aN" "$dN") PyTorch DDP (fp32) on loopback"
