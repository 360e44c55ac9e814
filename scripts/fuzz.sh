#!/usr/bin/env bash
# Fuzzing aiacc's parsers of outside bytes: fuzz/ has one libFuzzer target per parser (JPEG decode
# modes, the JPEG index, the pickle machine, torch.save archives and weight files, checkpoints,
# the checkpoint folder, recipes, flagfiles, launcher environments), built with ASan and UBSan.
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
#       A campaign: TARGET for SECONDS over its corpus (build-fuzz/corpus/TARGET, which the run
#       grows and keeps), its seeds and fuzz/corpus/TARGET (inputs that once crashed it, kept as
#       regressions). A crash, leak, timeout or error message of more than one line stops the run
#       with the input in build-fuzz/crashes/ and exit status 1; reproduce it with
#       build-fuzz/fuzz/TARGET FILE.
#   scripts/fuzz.sh --ci [SECONDS]
#       CI's fuzz configuration: every target over its seeds and regressions, then SECONDS (45 by
#       default) of fresh fuzzing, two targets at a time; prints executions and coverage per
#       target and fails on any finding.
#   scripts/fuzz.sh --list
# Builds build-fuzz/ (clang, -DAIACC_FUZZ=ON) and writes the seeds (scripts/fuzz_seeds.py, and those
# the targets encode themselves: AIACC_FUZZ_WRITE_SEEDS) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${AIACC_FUZZ_BUILD_DIR:-build-fuzz}
TARGETS=$(sed -n 's/^  \(fuzz_[a-z_]*\):.*/\1/p' fuzz/CMakeLists.txt)
# Each input within 10 s and 2 GiB (a hang or a bomb is a finding); no leak check at exit of an
# input: LibTorch keeps allocations of its own across calls (its allocator caches, thread pools).
FLAGS=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -detect_leaks=0)
# Leaks are checked when a target exits (fuzz/lsan.supp names the dependency's own).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}

build() {
  mkdir -p "$BUILD"
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    AIACC_BUILD_DIR=$BUILD scripts/build.sh -DCMAKE_CXX_COMPILER=clang++ -DAIACC_FUZZ=ON > "$BUILD/build.log" 2>&1 ||
      { tail -30 "$BUILD/build.log"; exit 1; }
  else
    cmake --build "$BUILD" -j "${AIACC_JOBS:-$(nproc)}" > "$BUILD/build.log" 2>&1 ||
      { tail -30 "$BUILD/build.log"; exit 1; }
  fi
}

seeds() {
  [ -f "$BUILD/seeds/.done" ] && return
  rm -rf "$BUILD/seeds"
  /usr/bin/python3 scripts/fuzz_seeds.py "$BUILD/seeds"
  for t in fuzz_checkpoint fuzz_torch_save; do
    mkdir -p "$BUILD/seeds/$t"
    AIACC_FUZZ_WRITE_SEEDS=$BUILD/seeds/$t "$BUILD/fuzz/$t" -runs=0 "$BUILD/seeds/$t" > "$BUILD/seeds/$t.log" 2>&1 ||
      { echo "fuzz.sh: $t failed while writing its seeds:"; tail -30 "$BUILD/seeds/$t.log"; exit 1; }
  done
  touch "$BUILD/seeds/.done"
}

# run TARGET SECONDS LOG [flags...]: the target over its corpus, seeds and regressions.
run() {
  local t=$1 s=$2 log=$3
  shift 3
  mkdir -p "$BUILD/corpus/$t" "$BUILD/crashes" "$BUILD/seeds/$t"
  local dirs=("$BUILD/corpus/$t" "$BUILD/seeds/$t")
  [ -d "fuzz/corpus/$t" ] && dirs+=("fuzz/corpus/$t")
  "$BUILD/fuzz/$t" "${FLAGS[@]}" -max_total_time="$s" -artifact_prefix="$BUILD/crashes/$t-" "$@" "${dirs[@]}" \
    > "$log" 2>&1
}

summary() {  # TARGET LOG: executions and coverage from libFuzzer's final lines (none after a crash)
  local execs cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$2" 2>/dev/null | tail -1 || true)
  cov=$( (grep -o 'cov: [0-9]* ft: [0-9]* corp: [0-9]*/[0-9a-zA-Z]*' "$2" 2>/dev/null || true) | tail -1)
  printf '%-20s %10s runs  %s\n' "$1" "${execs:-?}" "${cov:-no coverage line}"
}

case "${1:-}" in
  --list) echo "$TARGETS" ;;
  --ci)
    secs=${2:-45}
    build
    seeds
    mkdir -p "$BUILD/logs"
    export -f run
    export BUILD
    export FLAGS_STR="${FLAGS[*]}"
    # Two at a time: one per core.
    rm -f "$BUILD/logs/failed"
    for t in $TARGETS; do echo "$t"; done | xargs -P 2 -I{} bash -c \
      'FLAGS=($FLAGS_STR); run {} '"$secs"' "$BUILD/logs/{}.log" || { echo "fuzz.sh: {} FAILED" >> "$BUILD/logs/failed"; }' || true
    for t in $TARGETS; do summary "$t" "$BUILD/logs/$t.log"; done
    if [ -s "$BUILD/logs/failed" ]; then
      while read -r line; do
        t=$(echo "$line" | cut -d' ' -f2)
        echo "$line; the end of its log:"
        tail -40 "$BUILD/logs/$t.log"
      done < "$BUILD/logs/failed"
      rm -f "$BUILD/logs/failed"
      exit 1
    fi
    echo "fuzz.sh: every target ran clean"
    ;;
  "" | -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  *)
    t=$1
    secs=${2:?"usage: scripts/fuzz.sh TARGET SECONDS"}
    shift 2
    echo "$TARGETS" | grep -qx "$t" || { echo "fuzz.sh: no target '$t' (scripts/fuzz.sh --list)" >&2; exit 2; }
    build
    seeds
    mkdir -p "$BUILD/logs"
    log="$BUILD/logs/$t-$(date +%Y%m%d-%H%M%S).log"
    rc=0
    run "$t" "$secs" "$log" "$@" || rc=$?
    summary "$t" "$log"
    echo "fuzz.sh: log in $log"
    [ "$rc" = 0 ] || { tail -40 "$log"; exit 1; }
    ;;
esac
