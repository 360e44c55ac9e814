#!/usr/bin/env bash
# The final accuracy of an elastic job that loses a worker and takes it back, against the same job
# uninterrupted, seed by seed: the noise the test Elastic.AKilledWorkerStartedAgainRejoinsAndThe
# JobLearnsAsAnUninterruptedOne allows for. The test's job: 3 emulated nodes of one aiacc_train
# launcher and one worker each (--nnodes 2:3, shared memory), resnet18-w16 (the variable ARCH:
# another model) at 32 px, 8 epochs of a generated sample the model learns (6 hues of one shape,
# 40 training and 20 validation images each); node 2's worker is SIGKILLed after rank 0's first
# metrics line (step 2) and started again by its launcher (--max-restarts 1). Prints each seed's
# final top-1 of both jobs and their difference, then the differences' mean and standard
# deviation.
#   scripts/elastic_accuracy.sh [AIACC_TRAIN] [SEEDS] [-- FLAGS...]
#       (default: build/app/aiacc_train, seeds 0 1 2 3 4; FLAGS: more aiacc_train flags for both
#       jobs, after the script's own, e.g. -- --elastic-batch keep-global)
set -euo pipefail
BIN=build/app/aiacc_train; SEEDS="0 1 2 3 4"; EXTRA=()
[ $# -gt 0 ] && [ "$1" != -- ] && { BIN=$1; shift; }
[ $# -gt 0 ] && [ "$1" != -- ] && { SEEDS=$1; shift; }
[ $# -gt 0 ] && [ "$1" = -- ] && { shift; EXTRA=("$@"); }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'pkill -KILL -P $$ 2>/dev/null; rm -rf "$tmp"' EXIT
cd "$tmp"
"$BIN" --make-sample ds --sample-classes 6 --sample-shapes 1 --sample-train-per-class 40 --sample-val-per-class 20 \
  --sample-min-side 40 --sample-max-side 64 > /dev/null
job() {  # seed kill(0|1): the job's final top-1
  local seed=$1 kill=$2 n L=() port
  # (A port nobody listens on now, the kernel's pick: a random one can be taken.)
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  rm -f m.jsonl r.json
  for n in 0 1 2; do
    local extra=(); [ "$n" = 0 ] && extra=(--metrics-file m.jsonl --report-file r.json)
    "$BIN" --data ds --arch "${ARCH:-resnet18-w16}" --image-size 32 --batch-size 8 --epochs 8 --lr 0.4 --warmup-epochs 0 \
      --threads 1 --workers 1 --log-every 2 --comm-timeout 60 --rdzv-timeout 60 --rdzv-last-call 10 --seed "$seed" \
      --nproc 1 --nnodes 2:3 --node-rank "$n" --master "127.0.0.1:$port" --max-restarts 1 "${extra[@]}" "${EXTRA[@]}" \
      > "log$n" 2>&1 &
    L+=($!)
  done
  if [ "$kill" = 1 ]; then
    until [ -s m.jsonl ] || ! kill -0 "${L[0]}" 2> /dev/null; do sleep 0.1; done  # (or the job failed)
    kill -KILL "$(pgrep -P "${L[2]}" | head -1)"
  fi
  wait "${L[@]}" || { echo "the job failed (seed $seed, kill $kill):" >&2; tail -5 log0 >&2; exit 1; }
  "$here/json_get.py" r.json final_top1 %.1f
}
echo "seed  uninterrupted  killed+rejoined  difference (top-1, %)"
diffs=()
for s in $SEEDS; do
  u=$(job "$s" 0); k=$(job "$s" 1)
  d=$(awk -v a="$k" -v b="$u" 'BEGIN { printf "%.1f", a - b }')
  diffs+=("$d")
  printf "%4s  %13s  %15s  %10s\n" "$s" "$u" "$k" "$d"
done
printf "%s\n" "${diffs[@]}" | awk '{ s += $1; q += $1 * $1; n++ } END {
  m = s / n; sd = n > 1 ? sqrt((q - n * m * m) / (n - 1)) : 0
  printf "differences: mean %.1f, standard deviation %.1f over %d seeds\n", m, sd, n }'
