#!/usr/bin/env bash
# Two aiacc_train builds side by side (before and after a change), interleaved: for each round and
# configuration, both run the same 2-rank job (resnet18, batch 32 at 64 px, synthetic data, one
# compute thread per rank), in alternating order from round to round, and the line gives each
# steady images/s and their ratio. A change that should not move speed must stay within the
# rounds' spread.
#   scripts/bench_ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]
# e.g. git worktree add /tmp/before <commit> && (cd /tmp/before && scripts/build.sh) and
#      scripts/bench_ab.sh /tmp/before/build/app/aiacc_train build/app/aiacc_train 3
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
BEFORE=$1; AFTER=$2; ROUNDS=${3:-2}; STEPS=30; N=2; BATCH=32
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run() {  # bin flags...
  local bin=$1; shift
  if ! "$bin" --nproc $N --master 127.0.0.1:29681 --data synthetic --arch resnet18 --batch-size $BATCH \
      --image-size 64 --epochs 1 --warmup-epochs 0 --max-steps $((STEPS + 25)) --threads 1 \
      --synthetic-images $((BATCH * N * (STEPS + 30))) --report-file "$tmp/r.json" "$@" > "$tmp/log" 2>&1; then
    echo "bench_ab.sh: failed: $bin $*" >&2; tail -3 "$tmp/log" >&2; echo 0; return
  fi
  "$(dirname "$0")/json_get.py" "$tmp/r.json" steady_images_per_s %.1f
}
names=(plain fp16 streams2 autotune)
flags=("--noautotune --streams 1" "--noautotune --streams 1 --allreduce-dtype fp16" "--noautotune --streams 2" "")
for round in $(seq 1 "$ROUNDS"); do
  for k in "${!names[@]}"; do
    # shellcheck disable=SC2086
    if [ $((round % 2)) = 1 ]; then b=$(run "$BEFORE" ${flags[$k]}); a=$(run "$AFTER" ${flags[$k]});
    else a=$(run "$AFTER" ${flags[$k]}); b=$(run "$BEFORE" ${flags[$k]}); fi
    awk -v n="${names[$k]}" -v r="$round" -v a="$a" -v b="$b" \
      'BEGIN { printf "round %d %-9s before %7.1f  after %7.1f  after/before %.3f\n", r, n, b, a, (b > 0 ? a / b : 0) }'
  done
done
