#!/usr/bin/env bash
# bench_lab.sh: aiacc against PyTorch DDP on the emulated cluster (scripts/netlab.sh), measured
# in one run. For each layout (nodes x ranks per node), link rate and model it runs:
#   aiacc with everything on (fp16 transfer, two-level, streams, overlap, autotune, heap
#   settings, BN statistics averaged when read), then with each optimization off in turn;
#   PyTorch DDP fp32; PyTorch DDP with its fp16 compression hook; PyTorch DDP fp32 given aiacc's
#   heap settings, and with broadcast_buffers=False (ablation only);
# and one rank of each alone (no network) for scaling efficiency. Same model, batch, resolution,
# synthetic data and threads per rank everywhere. Prints a table of images/s with ratios to both
# DDP modes and ends with one headline line.
#
#   sudo scripts/bench_lab.sh [--layouts "2x2 4x1"] [--bw "1gbit 5gbit"]
#                             [--models "resnet18:64:16 resnet50:128:8"] [--steps N] [--repeat N]
#   scripts/bench_lab.sh --quick        # 2x2 at 1gbit, resnet18@64 only (the headline case)
#   --repeat N: run the three headline configurations (DDP fp32, DDP fp16, aiacc all on) N times
#   each, interleaved, and report medians (every run is listed); single runs vary by 10-20% here.
#   --no-ablation: skip the "each optimization off" rows (a resnet50@128 lab run takes ~11 min on
#   2 cores: the ablation alone is most of an hour per layout).
#   --ab "FLAGS A" "FLAGS B": instead of the table, aiacc with flag set A against flag set B,
#   --repeat N (default 4) interleaved rounds on the first layout, link and model; prints every
#   run, the medians and each round's B/A ratio. Single runs (the ablation rows) vary by 10-20%
#   on a 2-core host; this is the way to tell whether one lever matters.
#     scripts/bench_lab.sh --quick --ab "--bn-sync broadcast" "--bn-sync lazy"
#   A side that starts with "ddp" runs the PyTorch DDP peer instead: its VAR=value words become
#   its environment, other words its options (fp16, no-buffer-broadcast), e.g.
#     scripts/bench_lab.sh --quick --ab "ddp" "ddp MALLOC_TRIM_THRESHOLD_=1073741824"
#   --save DIR: keep each lab run of aiacc (rank 0's report JSON, timeline, and a .meta line with
#   layout, link rate and model) for scripts/simulate.py validate DIR.
#
# aiacc's figure is its steady rate (after 3 warm-up steps and the tuner's 20-40); DDP's is over
# the steps after its 3 warm-up steps. Needs root (namespaces). Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYOUTS="2x2 4x1"; BWS="1gbit 5gbit"; MODELS="resnet18:64:16 resnet50:128:8"; STEPS=20; SAVE=""; ABLATION=1; REPEAT=1; AB=0; AB_A=""; AB_B=""; REPEAT_SET=0
while [ $# -gt 0 ]; do
  case $1 in
    --layouts) LAYOUTS=$2; shift 2 ;;
    --bw) BWS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --repeat) REPEAT=$2; REPEAT_SET=1; shift 2 ;;
    --quick) LAYOUTS="2x2"; BWS="1gbit"; MODELS="resnet18:64:16"; shift ;;
    --save) SAVE=$(realpath -m "$2"); mkdir -p "$SAVE"; shift 2 ;;
    --no-ablation) ABLATION=0; shift ;;
    --ab) [ $# -ge 3 ] || { echo "bench_lab: --ab needs two flag sets, e.g. --ab \"--bn-sync broadcast\" \"--bn-sync lazy\"" >&2; exit 2; }
          AB_A=$2; AB_B=$3; AB=1; shift 3 ;;
    *) echo "bench_lab: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench_lab: must run as root (it builds a network-namespace lab)" >&2; exit 1; }
BIN=$PWD/${AIACC_BUILD_DIR:-build}/app/aiacc_train
[ -x "$BIN" ] || scripts/build.sh
LAB=scripts/netlab.sh
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap '$LAB down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
echo 29800 > "$tmp/port"
next_port() { local p; p=$(( $(cat "$tmp/port") + 1 )); echo "$p" > "$tmp/port"; echo "$p"; }  # survives $(...)
TUNE_STEPS=40  # the tuner's trials and confirmations (<= 39 steps) plus the rebuild step

# TCP retransmission timeouts summed over the lab's nodes (each namespace keeps its own
# counters). A timeout stalls a flow for 200 ms, then 400, 800, ... : a run that had any is
# named under its row, since its figure then measures the lab's queues as much as the code.
tcp_timeouts() {
  local nodes=$1 i v s=0
  for i in $(seq 0 $((nodes - 1))); do
    v=$($LAB run "$i" -- nstat -asz TcpExtTCPTimeouts 2>/dev/null | awk '$1 == "TcpExtTCPTimeouts" { print $2 }')
    s=$((s + ${v:-0}))
  done
  echo "$s"
}
# counted TAG NODES CMD...: runs CMD (its output is this function's); the timeouts it saw go to
# $tmp/rto.TAG for rto_note.
counted() {
  local tag=$1 nodes=$2 before rc=0; shift 2
  before=$(tcp_timeouts "$nodes")
  "$@" || rc=$?
  echo $(( $(tcp_timeouts "$nodes") - before )) > "$tmp/rto.$tag"
  return $rc
}
rto_note() {  # rto_note TAG: one line under a row whose run had timeouts
  local n; n=$(cat "$tmp/rto.$1" 2>/dev/null || echo 0)
  if [ "${n:-0}" -gt 0 ]; then echo "  ^ $n TCP retransmission timeout(s) on the lab links during this run"; fi
  return 0
}

# aiacc NODES PER ARCH BATCH SIZE THREADS extra-flags...: steady images/s of one job on the lab
# (or on the host when NODES is 0: one process, no network).
aiacc() {
  local nodes=$1 per=$2 arch=$3 batch=$4 size=$5 threads=$6; shift 6
  local world=$(( nodes > 0 ? nodes * per : 1 )) steps=$((3 + TUNE_STEPS + STEPS)) PORT
  PORT=$(next_port)
  local common=(--data synthetic --arch "$arch" --batch-size "$batch" --image-size "$size" --epochs 1
                --warmup-epochs 0 --max-steps "$steps" --threads "$threads" --comm-timeout 300
                --synthetic-images $((batch * world * (steps + 2))) --progress-seconds 1000)
  if [ "$nodes" -eq 0 ]; then
    "$BIN" "${common[@]}" --report-file "$tmp/r.json" "$@" > "$tmp/log" 2>&1
  else
    local i save=()
    if [ -n "$SAVE" ]; then
      local id; id=$(printf "run%03d" "$PORT")
      save=(--timeline "$SAVE/$id.timeline.json")
      echo "nodes=$nodes per_node=$per bw=$CUR_BW arch=$arch batch=$batch size=$size steps=$STEPS flags=$*" > "$SAVE/$id.meta"
    fi
    for i in $(seq 1 $((nodes - 1))); do
      $LAB run "$i" -- "$BIN" --nproc "$per" --nnodes "$nodes" --node-rank "$i" --master "$($LAB addr 0):$PORT" \
        "${common[@]}" "$@" > "$tmp/log$i" 2>&1 &
    done
    $LAB run 0 -- "$BIN" --nproc "$per" --nnodes "$nodes" --node-rank 0 --master "$($LAB addr 0):$PORT" \
      "${common[@]}" --report-file "$tmp/r.json" "${save[@]}" "$@" > "$tmp/log" 2>&1 || { cat "$tmp/log" >&2; wait; return 1; }
    wait
    [ -z "$SAVE" ] || cp "$tmp/r.json" "$SAVE/$(printf "run%03d" "$PORT").report.json"
  fi
  scripts/json_get.py "$tmp/r.json" steady_images_per_s %.1f
  grep -o 'autotune: chose[^(]*' "$tmp/log" | head -1 > "$tmp/tuned" || true
}

# ddp NODES PER ARCH BATCH SIZE THREADS [fp16]: PyTorch DDP (gloo) images/s, same launch shape.
# DDP_ENV: extra environment for the peer (the ablation's "DDP with aiacc's heap settings" row).
DDP_ENV=""
# glibc's environment spelling of what aiacc_train's --keep-freed-memory sets with mallopt.
HEAP_ENV="MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864"
ddp() {
  local nodes=$1 per=$2 arch=$3 batch=$4 size=$5 threads=$6 PORT; shift 6
  PORT=$(next_port)
  if [ "$nodes" -eq 0 ]; then
    env $DDP_ENV RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT GLOO_SOCKET_IFNAME=lo \
      $PY scripts/ddp_peer.py "$arch" "$batch" "$size" "$STEPS" "$threads" "$@" > "$tmp/ddp0" 2>&1
  else
    local pids=() i l
    for i in $(seq 0 $((nodes - 1))); do
      for l in $(seq 0 $((per - 1))); do
        $LAB run "$i" -- env $DDP_ENV RANK=$((i * per + l)) WORLD_SIZE=$((nodes * per)) MASTER_ADDR="$($LAB addr 0)" \
          MASTER_PORT=$PORT GLOO_SOCKET_IFNAME=eth0 \
          $PY scripts/ddp_peer.py "$arch" "$batch" "$size" "$STEPS" "$threads" "$@" > "$tmp/ddp$((i * per + l))" 2>&1 &
        pids+=($!)
      done
    done
    wait "${pids[@]}" || { cat "$tmp/ddp0" >&2; return 1; }
  fi
  sed -n 's/ddp: \([0-9.]*\) images\/s/\1/p' "$tmp/ddp0"
}

# median_fmt FORMAT VALUES...: the median (the mean of the middle two for an even count).
median_fmt() { local f=$1; shift; printf "%s\n" "$@" | sort -g | awk -v f="$f" '{ v[NR] = $1 } END { printf f "\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
median_of() { median_fmt "%.1f" "$@"; }  # images/s
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
eff() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / (n * b); else print "-" }'; }
row() { printf "%-50s %10s %12s %12s\n" "$1" "$2" "$3" "$4"; }
# shape LAYOUT: nodes, per (ranks per node), world and threads (per rank: the cores shared out).
shape() {
  nodes=${1%x*}; per=${1#*x}; world=$((nodes * per))
  threads=$(( CORES / world )); [ "$threads" -ge 1 ] || threads=1
}

CORES=$(nproc)
if [ "$AB" = 1 ]; then
  layout=${LAYOUTS%% *}; bw=${BWS%% *}; m=${MODELS%% *}
  shape "$layout"
  IFS=: read -r arch size batch <<< "$m"
  [ "$REPEAT_SET" = 1 ] || REPEAT=4
  $LAB up --nodes "$nodes" --bw "$bw" > /dev/null
  CUR_BW=$bw
  echo "A/B on $layout at $bw, $arch batch $batch/rank @ $size px, $threads thread(s)/rank, $REPEAT interleaved rounds"
  echo "  A: $AB_A"
  echo "  B: $AB_B"
  # side SPEC: aiacc with the flags in SPEC; or, when SPEC starts with "ddp", the DDP peer, its
  # VAR=value words as environment and its other words as peer options (fp16, no-buffer-broadcast).
  side() {
    local spec=$1 w env="" opts=()
    if [ "${spec%% *}" != ddp ]; then
      # shellcheck disable=SC2086
      aiacc "$nodes" "$per" "$arch" "$batch" "$size" "$threads" $spec
      return
    fi
    for w in ${spec#ddp}; do
      case $w in *=*) env="$env $w" ;; *) opts+=("$w") ;; esac
    done
    DDP_ENV=$env
    ddp "$nodes" "$per" "$arch" "$batch" "$size" "$threads" "${opts[@]}"
    DDP_ENV=""
  }
  as=""; bs=""; rs=""
  for rep in $(seq 1 "$REPEAT"); do
    a=$(counted abA "$nodes" side "$AB_A")
    b=$(counted abB "$nodes" side "$AB_B")
    r=$(ratio "$b" "$a")
    echo "round $rep: A $a, B $b images/s (B/A $r)"; rto_note abA; rto_note abB
    as="$as $a"; bs="$bs $b"; rs="$rs ${r%x}"
  done
  $LAB down > /dev/null
  # shellcheck disable=SC2086
  echo "medians: A $(median_of $as), B $(median_of $bs) images/s; B/A per round:$rs (median $(median_fmt "%.2f" $rs)x)"
  exit 0
fi
HEADLINE=""
echo "bench_lab: $CORES cores; layouts: $LAYOUTS; links: $BWS; models: $MODELS; $STEPS timed steps"
for layout in $LAYOUTS; do
  shape "$layout"
  for bw in $BWS; do
    $LAB up --nodes "$nodes" --bw "$bw" > /dev/null
    CUR_BW=$bw
    for m in $MODELS; do
      IFS=: read -r arch size batch <<< "$m"
      echo
      echo "== $layout ($nodes nodes x $per ranks) at $bw: $arch batch $batch/rank @ $size px, $threads thread(s)/rank =="
      a1=$(aiacc 0 1 "$arch" "$batch" "$size" "$threads" --noautotune)
      d1=$(ddp 0 1 "$arch" "$batch" "$size" "$threads")
      # The three headline runs, --repeat times, interleaved (this host's speed drifts by 10-20%
      # over minutes): the table shows each one's median, and every run is listed below it.
      dFs=""; dHs=""; aAs=""; tuned=""; rF=0; rH=0; rA=0
      for rep in $(seq 1 "$REPEAT"); do
        dFs="$dFs $(counted dF "$nodes" ddp "$nodes" "$per" "$arch" "$batch" "$size" "$threads")"; rF=$((rF + $(cat "$tmp/rto.dF")))
        dHs="$dHs $(counted dH "$nodes" ddp "$nodes" "$per" "$arch" "$batch" "$size" "$threads" fp16)"; rH=$((rH + $(cat "$tmp/rto.dH")))
        aAs="$aAs $(counted aA "$nodes" aiacc "$nodes" "$per" "$arch" "$batch" "$size" "$threads" --allreduce-dtype fp16)"; rA=$((rA + $(cat "$tmp/rto.aA")))
        tuned="$tuned${tuned:+; }$(sed 's/^autotune: //; s/ *$//' "$tmp/tuned")"
      done
      echo "$rF" > "$tmp/rto.dF"; echo "$rH" > "$tmp/rto.dH"; echo "$rA" > "$tmp/rto.aA"
      dF=$(median_of $dFs); dH=$(median_of $dHs); aA=$(median_of $aAs)
      row "configuration" "images/s" "vs DDP fp32" "vs DDP fp16"
      row "PyTorch DDP fp32" "$dF" "1.00x" "$(ratio "$dF" "$dH")"; rto_note dF
      row "PyTorch DDP fp16 compression hook" "$dH" "$(ratio "$dH" "$dF")" "1.00x"; rto_note dH
      row "aiacc, all on + autotune" "$aA" "$(ratio "$aA" "$dF")" "$(ratio "$aA" "$dH")"; rto_note aA
      if [ "$ABLATION" = 1 ]; then
        # The heap setting is not communication: DDP given the same one shows how much of the
        # lead is aiacc's allocator use rather than its gradient exchange.
        DDP_ENV=$HEAP_ENV
        dK=$(counted dK "$nodes" ddp "$nodes" "$per" "$arch" "$batch" "$size" "$threads")
        DDP_ENV=""
        row "PyTorch DDP fp32, aiacc's heap settings" "$dK" "$(ratio "$dK" "$dF")" "$(ratio "$dK" "$dH")"; rto_note dK
        # aiacc averages BN statistics only when they are read (--bn-sync lazy); DDP's
        # broadcast_buffers=False is the nearest DDP setting (it never syncs them).
        dB=$(counted dB "$nodes" ddp "$nodes" "$per" "$arch" "$batch" "$size" "$threads" no-buffer-broadcast)
        row "PyTorch DDP fp32, broadcast_buffers=False" "$dB" "$(ratio "$dB" "$dF")" "$(ratio "$dB" "$dH")"; rto_note dB
      fi
      for off in "fp16 transfer off:--allreduce-dtype fp32" "two-level off:--allreduce-dtype fp16 --hierarchical off" \
                 "multi-stream off:--allreduce-dtype fp16 --streams 1" "autotune off:--allreduce-dtype fp16 --noautotune" \
                 "heap settings off (--nokeep-freed-memory):--allreduce-dtype fp16 --nokeep-freed-memory" \
                 "BN stats broadcast each step (DDP's way):--allreduce-dtype fp16 --bn-sync broadcast"; do
        [ "$ABLATION" = 1 ] || break
        name=${off%%:*}; flags=${off#*:}
        # shellcheck disable=SC2086
        v=$(counted off "$nodes" aiacc "$nodes" "$per" "$arch" "$batch" "$size" "$threads" $flags)
        row "aiacc, $name" "$v" "$(ratio "$v" "$dF")" "$(ratio "$v" "$dH")"; rto_note off
      done
      [ "$REPEAT" -eq 1 ] || echo "runs (medians above): DDP fp32$dFs; DDP fp16$dHs; aiacc all on$aAs"
      echo "tuner (all on): ${tuned:-n/a}"
      echo "1 rank alone: aiacc $a1, DDP $d1 images/s; scaling efficiency ($world ranks): aiacc $(eff "$aA" "$a1" "$world"), DDP fp32 $(eff "$dF" "$d1" "$world"), DDP fp16 $(eff "$dH" "$d1" "$world")"
      if [ -z "$HEADLINE" ] || { [ "$layout" = 2x2 ] && [ "$bw" = 1gbit ] && [ "${HEADLINE%%|*}" != "2x2 1gbit" ]; }; then
        HEADLINE="$layout $bw|$layout at $bw, $arch@$size: aiacc $(ratio "$aA" "$dF") PyTorch DDP fp32, $(ratio "$aA" "$dH") DDP fp16 (targets 1.5x, 1.2x)"
      fi
    done
    $LAB down > /dev/null
  done
done
echo
echo "headline: ${HEADLINE#*|}"
