#!/usr/bin/env bash
# Recovery from a lost node: aiacc's elastic regroup against what users have today, a restart of
# the whole job from its newest checkpoint (torchrun's way), in the same run, interleaved. Three
# emulated nodes on this box (one aiacc_train launcher with one worker each; they share the host,
# so shared memory carries the gradients), resnet18
# at 64 px on the generated sample dataset; node 2's worker is SIGKILLed after step KILL_AT.
#   elastic: --nnodes 2:3; seconds from the kill to the end of the first step the two survivors
#            complete after it, at most detect_s + first_step_s of the report's membership record
#            (detect_s counts from the end of the last step before the kill, first_step_s from
#            the failure), and steps lost;
#   restart: --nnodes 3 with --checkpoint-every EVERY steps; the job fails fast (the peers name the
#            lost rank), then all three nodes start again with --resume auto; seconds from the
#            kill to the first metrics line of the restarted job (its first step), and the steps
#            redone (the killed job's last step - the step resumed from).
#   scripts/bench_elastic.sh [AIACC_TRAIN] [ROUNDS]
set -uo pipefail
BIN=${1:-build/app/aiacc_train}; ROUNDS=${2:-3}; KILL_AT=15; EVERY=10
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'pkill -KILL -P $$ 2>/dev/null; rm -rf "$tmp"' EXIT
"$BIN" --make-sample "$tmp/ds" --sample-classes 10 --sample-train-per-class 120 --sample-val-per-class 5 >/dev/null
now() { date +%s.%N; }
node() {  # node-rank nnodes port extra...: one node's launcher in the background, its pid in PID
  local n=$1 nnodes=$2 port=$3; shift 3
  "$BIN" --data "$tmp/ds" --arch resnet18 --image-size 64 --batch-size 16 --epochs 1 --warmup-epochs 0 \
    --threads 1 --workers 1 --log-every 1 --progress-seconds 1000 --comm-timeout 60 --nproc 1 --nnodes "$nnodes" \
    --node-rank "$n" --master 127.0.0.1:"$port" "$@" >> "$tmp/log$n" 2>&1 &
  PID=$!
}
stepOf() {  # the last step a metrics file records (0: none yet)
  local s; s=$(grep -o '"type":"step","step":[0-9]*' "$1" 2>/dev/null | tail -1 | grep -o '[0-9]*$'); echo "${s:-0}"
}
elastic() {
  local port=$((30000 + RANDOM % 20000)) l0 l1 l2
  rm -f "$tmp"/log* "$tmp/m.jsonl" "$tmp/r.json"
  node 0 2:3 $port --metrics-file "$tmp/m.jsonl" --report-file "$tmp/r.json"; l0=$PID
  node 1 2:3 $port; l1=$PID; node 2 2:3 $port; l2=$PID
  until [ "$(stepOf "$tmp/m.jsonl")" -ge $KILL_AT ]; do sleep 0.05; done
  kill -KILL "$(pgrep -P "$l2")"
  wait "$l0" "$l1" "$l2" 2>/dev/null
  local d f; d=$("$here/json_get.py" "$tmp/r.json" membership.0.detect_s); f=$("$here/json_get.py" "$tmp/r.json" membership.0.first_step_s)
  awk -v d="$d" -v f="$f" 'BEGIN { printf "%.2f", d + f }'
  echo " $("$here/json_get.py" "$tmp/r.json" membership.0.steps_lost %d)"
}
restart() {
  local port=$((30000 + RANDOM % 20000)) l0 l1 l2 t0 killed resumed
  rm -rf "$tmp"/log* "$tmp/m.jsonl" "$tmp/ck"
  node 0 3 $port --checkpoint-dir "$tmp/ck" --checkpoint-every $EVERY --metrics-file "$tmp/m.jsonl"; l0=$PID
  node 1 3 $port --checkpoint-dir "$tmp/ck" --checkpoint-every $EVERY; l1=$PID
  node 2 3 $port --checkpoint-dir "$tmp/ck" --checkpoint-every $EVERY; l2=$PID
  until [ "$(stepOf "$tmp/m.jsonl")" -ge $KILL_AT ]; do sleep 0.05; done
  kill -KILL "$(pgrep -P "$l2")"; t0=$(now)
  wait "$l0" "$l1" "$l2" 2>/dev/null
  killed=$(stepOf "$tmp/m.jsonl"); rm -f "$tmp/m.jsonl"
  port=$((30000 + RANDOM % 20000))
  node 0 3 $port --checkpoint-dir "$tmp/ck" --resume auto --metrics-file "$tmp/m.jsonl"; l0=$PID
  node 1 3 $port --checkpoint-dir "$tmp/ck" --resume auto; l1=$PID
  node 2 3 $port --checkpoint-dir "$tmp/ck" --resume auto; l2=$PID
  until [ -s "$tmp/m.jsonl" ]; do sleep 0.05; done
  local t1; t1=$(now)
  resumed=$(grep -o 'resumed from .* at step [0-9]*' "$tmp/log0" | tail -1 | grep -o '[0-9]*$')
  kill -TERM "$l0" "$l1" "$l2" 2>/dev/null; wait "$l0" "$l1" "$l2" 2>/dev/null
  awk -v a="$t0" -v b="$t1" -v k="$killed" -v r="${resumed:-0}" 'BEGIN { printf "%.2f %d\n", b - a, k - r }'
}
echo "round  elastic: s kill->first step, steps lost   restart: s kill->first step, steps redone   speedup"
for r in $(seq "$ROUNDS"); do
  read -r es el <<< "$(elastic)"
  read -r rs rl <<< "$(restart)"
  printf "%5d  %8s s %6s                          %8s s %6s                          %.1fx\n" "$r" "$es" "$el" "$rs" \
    "$rl" "$(awk -v a="$rs" -v b="$es" 'BEGIN { print (b > 0 ? a / b : 0) }')"
done
