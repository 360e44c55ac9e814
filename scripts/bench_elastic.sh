#!/usr/bin/env bash
# Recovery from a lost rank: aiacc's elastic regroup against what users have today, a restart of
# the whole job from its newest checkpoint (torchrun's way), in the same run, interleaved.
# resnet18 at 64 px on the generated sample dataset; one worker is SIGKILLed after step KILL_AT.
#   this box (default): three emulated nodes, one aiacc_train launcher with one worker each; they
#            share the host, so shared memory carries the gradients; node 2's worker is killed;
#   --lab:   the emulated cluster (scripts/netlab.sh, root): 2 nodes x 2 ranks, 1 Gbit/s links,
#            Gloo between the nodes; one of node 1's two workers is killed.
# Measured:
#   elastic: --nnodes MIN:MAX (2:3; on the lab 1:2, so 3 ranks go on); seconds from the kill to
#            the end of the first step the survivors complete after it (rank 0 writes the
#            membership record to its metrics file then; looked for every 10 ms), and steps lost.
#            The report's record of the change (detect_s, regroup_s, restore_s, bytes) follows
#            each round's line;
#   restart: a fixed --nnodes with --checkpoint-every EVERY steps; the job fails fast (the peers
#            name the lost rank), then every node starts again with --resume auto; seconds from
#            the kill to the first metrics line of the restarted job (its first step), and the
#            steps redone (the killed job's last step - the step resumed from). Two kinds:
#            "aiacc": one survivor, elected in the store, saves the step it reached before the
#            job stops (aiacc's own fixed-size job), so nothing is redone; "torchrun": no such save
#            (AIACC_BENCH_NO_SURVIVOR_SAVE=1), the restart resumes from the newest periodic
#            checkpoint, as users of torchrun have it.
#   Both:    "back": seconds from the kill until the job completes the step the kill cut (the
#            step after the last one rank 0 had logged): the restart redoes the steps since its
#            checkpoint first (kill after step KILL_AT, a checkpoint every EVERY: 5 of them, the
#            average a kill at a random step costs), the elastic job only the step in flight.
#   scripts/bench_elastic.sh [--lab] [AIACC_TRAIN] [ROUNDS]
# (AIACC_TRAIN: build/app/aiacc_train_hooked by default, the build that reads AIACC_BENCH_*:
# app/binary_hooks.h; every run of the comparison uses it.)
set -uo pipefail
LAB=0
[ "${1:-}" = "--lab" ] && { LAB=1; shift; }
BIN=${1:-build/app/aiacc_train_hooked}; ROUNDS=${2:-3}; KILL_AT=15; EVERY=10
here=$(cd "$(dirname "$0")" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")  # (absolute: the lab's nodes run it too)
tmp=$(mktemp -d)
if [ $LAB = 1 ]; then
  NODES=2; NPROC=2; RANGE=1:2; MASTER=$("$here/netlab.sh" addr 0)
  "$here/netlab.sh" up --nodes $NODES --bw 1gbit > /dev/null || exit 1
  trap 'pkill -KILL -P $$ 2>/dev/null; "$here/netlab.sh" down > /dev/null 2>&1; rm -rf "$tmp"' EXIT
else
  NODES=3; NPROC=1; RANGE=2:3; MASTER=127.0.0.1
  trap 'pkill -KILL -P $$ 2>/dev/null; rm -rf "$tmp"' EXIT
fi
VICTIM=$((NODES - 1))  # the node one of whose workers is killed
"$BIN" --make-sample "$tmp/ds" --sample-classes 10 --sample-train-per-class 120 --sample-val-per-class 5 >/dev/null
now() { date +%s.%N; }
node() {  # node-rank nnodes port extra...: one node's launcher in the background, its pid in PID
  local n=$1 nnodes=$2 port=$3 prefix=(); shift 3
  [ $LAB = 1 ] && prefix=("$here/netlab.sh" run "$n" --)
  "${prefix[@]}" "$BIN" --data "$tmp/ds" --arch resnet18 --image-size 64 --batch-size 16 --epochs 1 --warmup-epochs 0 \
    --threads 1 --workers 1 --log-every 1 --progress-seconds 1000 --comm-timeout 60 --nproc $NPROC --nnodes "$nnodes" \
    --node-rank "$n" --master "$MASTER:$port" "$@" >> "$tmp/log$n" 2>&1 &
  PID=$!
}
stepOf() {  # the last step a metrics file records (0: none yet)
  local s; s=$(grep -o '"type":"step","step":[0-9]*' "$1" 2>/dev/null | tail -1 | grep -o '[0-9]*$'); echo "${s:-0}"
}
nodes() {  # nnodes port extra...: every node's launcher (node 0 with the extra rank-0 flags in R0), pids in L
  local nnodes=$1 port=$2 n; shift 2
  L=()
  for n in $(seq 0 $((NODES - 1))); do
    if [ "$n" = 0 ]; then node 0 "$nnodes" "$port" "$@" "${R0[@]}"; else node "$n" "$nnodes" "$port" "$@"; fi
    L+=("$PID")
  done
}
killOne() { kill -KILL "$(pgrep -P "${L[$VICTIM]}" | head -1)"; }  # one worker of the victim node
elastic() {
  local port=$((30000 + RANDOM % 20000)) t0 t1
  rm -f "$tmp"/log* "$tmp/m.jsonl" "$tmp/r.json"
  R0=(--metrics-file "$tmp/m.jsonl" --report-file "$tmp/r.json"); nodes $RANGE $port
  until [ "$(stepOf "$tmp/m.jsonl")" -ge $KILL_AT ]; do sleep 0.05; done
  local cut t2
  killOne; t0=$(now)
  cut=$(($(stepOf "$tmp/m.jsonl") + 1))
  until grep -q '"event":"membership"' "$tmp/m.jsonl"; do sleep 0.01; done  # written at the first step's end
  t1=$(now)
  until [ "$(stepOf "$tmp/m.jsonl")" -ge $cut ]; do sleep 0.01; done
  t2=$(now)
  wait "${L[@]}" 2>/dev/null
  awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { printf "%.2f %.2f", b - a, c - a }'
  echo " $("$here/json_get.py" "$tmp/r.json" membership.0.steps_lost %d)"
  "$here/json_get.py" "$tmp/r.json" membership.0 > "$tmp/record"  # detect_s, regroup_s, restore_s, bytes
}
restart() {  # aiacc|torchrun
  local port=$((30000 + RANDOM % 20000)) t0 killed resumed
  rm -rf "$tmp"/log* "$tmp/m.jsonl" "$tmp/ck"
  R0=(--metrics-file "$tmp/m.jsonl")
  if [ "$1" = torchrun ]; then export AIACC_BENCH_NO_SURVIVOR_SAVE=1; else unset AIACC_BENCH_NO_SURVIVOR_SAVE; fi
  nodes $NODES $port --checkpoint-dir "$tmp/ck" --checkpoint-every $EVERY
  unset AIACC_BENCH_NO_SURVIVOR_SAVE
  until [ "$(stepOf "$tmp/m.jsonl")" -ge $KILL_AT ]; do sleep 0.05; done
  killOne; t0=$(now)
  wait "${L[@]}" 2>/dev/null
  killed=$(stepOf "$tmp/m.jsonl"); rm -f "$tmp/m.jsonl"
  port=$((30000 + RANDOM % 20000))
  R0=(--metrics-file "$tmp/m.jsonl"); nodes $NODES $port --checkpoint-dir "$tmp/ck" --resume auto
  until [ -s "$tmp/m.jsonl" ]; do sleep 0.01; done
  local t1 t2; t1=$(now)
  until [ "$(stepOf "$tmp/m.jsonl")" -gt "$killed" ]; do sleep 0.01; done
  t2=$(now)
  resumed=$(grep -o 'resumed from .* at step [0-9]*' "$tmp/log0" | tail -1 | grep -o '[0-9]*$')
  kill -TERM "${L[@]}" 2>/dev/null; wait "${L[@]}" 2>/dev/null
  awk -v a="$t0" -v b="$t1" -v c="$t2" -v k="$killed" -v r="${resumed:-0}" \
    'BEGIN { printf "%.2f %.2f %d\n", b - a, c - a, k - r }'
}
echo "layout: $NODES nodes x $NPROC ranks ($([ $LAB = 1 ] && echo "the lab, 1 Gbit/s links, Gloo between nodes" || echo "this box, shared memory")); one worker of node $VICTIM killed after step $KILL_AT"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1fx", (b > 0 ? a / b : 0) }'; }
echo "seconds from the kill to the first step after it (steps lost or redone), then to the step the kill cut;"
echo "speedup: a restart's seconds / the elastic job's"
echo "round  elastic: first  cut    | aiacc restart: first  cut    speedup    | torchrun restart: first  cut    speedup"
for r in $(seq "$ROUNDS"); do
  read -r es eb el <<< "$(elastic)"
  record=$(cat "$tmp/record" 2> /dev/null)
  read -r as ab al <<< "$(restart aiacc)"
  read -r ts tb tl <<< "$(restart torchrun)"
  printf "%5d  %6s s (%s) %5s s | %6s s (%s)     %5s s  %4s %4s | %6s s (%s)        %5s s  %4s %4s\n" "$r" \
    "$es" "$el" "$eb" "$as" "$al" "$ab" "$(ratio "$as" "$es")" "$(ratio "$ab" "$eb")" "$ts" "$tl" "$tb" \
    "$(ratio "$ts" "$es")" "$(ratio "$tb" "$eb")"
  echo "       elastic's record: $record"
done
