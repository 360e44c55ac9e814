#!/usr/bin/env bash
# What preemption safety costs and saves, for a 2-rank resnet18 job at 64 px (batch 32, synthetic
# data, one compute thread per rank), in one run:
#   1. the per-step stop agreement (one byte OR behind each step's gradients): a build without it
#      (BEFORE_BIN, e.g. the commit before it) against this one, interleaved, steady images/s;
#   2. background checkpoints (--checkpoint-every K steps) against none, this build, interleaved;
#   3. signal to exit: SIGTERM to the launcher mid-epoch until it has exited 75 (checkpoint written);
#   4. work lost: steps trained after the saved one (redone after --resume auto) against what
#      epoch-end checkpoints alone would lose at the same stop (the steps since the epoch began).
#   scripts/bench_preempt.sh BEFORE_BIN [AFTER_BIN] [ROUNDS]
# e.g. git worktree add /tmp/before b049886 && (cd /tmp/before && scripts/build.sh) and
#      scripts/bench_preempt.sh /tmp/before/build/app/aiacc_train build/app/aiacc_train 3
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
BEFORE=$1; AFTER=${2:-build/app/aiacc_train}; ROUNDS=${3:-3}; STEPS=40; N=2; BATCH=32; EVERY=5
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
job() {  # bin flags...: the common job (exec: in the background, $! is the launcher itself)
  local bin=$1; shift
  exec "$bin" --nproc $N --master 127.0.0.1:29683 --data synthetic --arch resnet18 --batch-size $BATCH --image-size 64 \
    --epochs 1 --warmup-epochs 0 --threads 1 --noautotune --streams 1 --progress-seconds 1000 "$@"
}
steady() {  # bin flags...: steady images/s of a STEPS-step run
  rm -rf "$tmp/ck"
  if ! (job "$@" --max-steps $((STEPS + 5)) --synthetic-images $((BATCH * N * (STEPS + 10))) \
      --report-file "$tmp/r.json") > "$tmp/log" 2>&1; then
    echo "bench_preempt.sh: failed: $*" >&2; tail -3 "$tmp/log" >&2; echo 0; return
  fi
  "$(dirname "$0")/json_get.py" "$tmp/r.json" steady_images_per_s %.1f
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'; }
echo "1. stop agreement: $BEFORE (without) against $AFTER (with), steady images/s"
echo "2. background checkpoints every $EVERY steps against none ($AFTER)"
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then
    b=$(steady "$BEFORE"); a=$(steady "$AFTER"); c=$(steady "$AFTER" --checkpoint-dir "$tmp/ck" --checkpoint-every $EVERY)
  else
    c=$(steady "$AFTER" --checkpoint-dir "$tmp/ck" --checkpoint-every $EVERY); a=$(steady "$AFTER"); b=$(steady "$BEFORE")
  fi
  echo "round $round: without vote $b, with $a (with/without $(ratio "$a" "$b")); with checkpoints $c (/none $(ratio "$c" "$a"))"
done
echo "3./4. SIGTERM to the launcher after 25 step lines (an epoch of 100 steps)"
rm -rf "$tmp/ck" "$tmp/m.jsonl"
job "$AFTER" --synthetic-images $((BATCH * N * 100)) --checkpoint-dir "$tmp/ck" --metrics-file "$tmp/m.jsonl" \
  > "$tmp/log" 2>&1 &
L=$!
for _ in $(seq 1200); do [ -f "$tmp/m.jsonl" ] && [ "$(wc -l < "$tmp/m.jsonl")" -ge 25 ] && break; sleep 0.1; done
t0=$(date +%s%N); kill -TERM $L; wait $L; rc=$?; t1=$(date +%s%N)
trained=$("$(dirname "$0")/json_get.py" --count-lines "$tmp/m.jsonl" step)
saved=$(sed -n 's/.*stopped by SIGTERM after step \([0-9]*\); saved.*/\1/p' "$tmp/log" | head -1)
echo "signal to exit: $(( (t1 - t0) / 1000000 )) ms, exit code $rc (75: saved, resumable)"
echo "steps trained $trained, saved at step ${saved:-none}: lost $((trained - ${saved:-0})) step(s);" \
  "with epoch-end checkpoints only: $trained step(s) (the epoch had begun at step 0)"
