#!/usr/bin/env bash
# Runs chosen CTest tests N times beside each other, under load, and counts failures per test:
# a test that fails one time in twenty shows up here, not in CI.
#   scripts/soak.sh [N] [FILTER]    N runs (default 10) of the tests matching the CTest regex
#                                   FILTER (default: every test) in a built folder
#   scripts/soak.sh --beside N FILTER   N runs of FILTER's tests, one at a time, while the other
#                                   JOBS-1 slots run the rest of the suite over and over (as under
#                                   CI's `ctest -j2`, with FILTER's tests N times in one slot)
# Each run is one `ctest -R FILTER -j JOBS --schedule-random`: the selected tests run side by side
# in a new random order every time. At the end: one line per test (passed, failed, not run, and
# for a failing test the runs it failed in and how: Failed, Timeout, Exception), then the totals;
# exit 1 if any test failed (2 on bad arguments or when no test matches). The output of every
# run with a failure is kept:
# run-K.log (ctest's, with each failed test's output) and run-K.LastTest.log (every test's
# output) in the folder named at the start and the end; every run's run-K.xml (JUnit) too.
# With --beside, the rest of the suite's completed runs are counted too (beside-K.xml, .log); its
# last run, stopped when FILTER's N runs end, is read from its log: its completed tests and failures.
# A CTest test is a GoogleTest suite ("Membership.*"), or one test labelled process
# (cmake/GTestGroups.cmake): the counts are per CTest test, and FILTER names suites. For one
# GoogleTest test: build/tests/aiacc_tests --gtest_filter=Suite.Test --gtest_repeat=N.
# Environment:
#   AIACC_BUILD_DIR     build folder (default build/, as scripts/test.sh)
#   AIACC_SOAK_JOBS     tests at once (default 2, CI's -j)
#   AIACC_SOAK_LOAD     busy-loop processes beside the tests, one core each (default 0)
#   AIACC_SOAK_TIMEOUT  seconds per test before ctest kills it (default 600, CI's)
#   AIACC_SOAK_OUT      where the logs go (default BUILD/soak/<date-time>)
#   extra ctest arguments after `--`: scripts/soak.sh 20 'Autotune' -- -L comm
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }

N=10
FILTER=""
BESIDE=0
EXTRA=()
pos=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --beside) BESIDE=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    -*) echo "soak.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *)
      case $pos in
        0) N=$1 ;;
        1) FILTER=$1 ;;
        *) echo "soak.sh: too many arguments at '$1' (see --help)" >&2; exit 2 ;;
      esac
      pos=$((pos + 1))
      ;;
  esac
  shift
done
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "soak.sh: N must be a positive number of runs (got '$N')" >&2; exit 2; }
BUILD=${AIACC_BUILD_DIR:-build}
JOBS=${AIACC_SOAK_JOBS:-2}
LOAD=${AIACC_SOAK_LOAD:-0}
TIMEOUT=${AIACC_SOAK_TIMEOUT:-600}
if [ "$BESIDE" = 1 ]; then
  [ -n "$FILTER" ] || { echo "soak.sh: --beside needs a FILTER: the tests that run N times beside the rest" >&2; exit 2; }
  [[ "$JOBS" =~ ^[0-9]+$ ]] && [ "$JOBS" -ge 2 ] || { echo "soak.sh: --beside needs AIACC_SOAK_JOBS of 2 or more (got '$JOBS')" >&2; exit 2; }
fi
[[ "$LOAD" =~ ^[0-9]+$ ]] || { echo "soak.sh: AIACC_SOAK_LOAD must be a number of busy loops (got '$LOAD')" >&2; exit 2; }
[ -f "$BUILD/CTestTestfile.cmake" ] || { echo "soak.sh: no tests in '$BUILD' (build it: scripts/build.sh)" >&2; exit 2; }
OUT=${AIACC_SOAK_OUT:-$BUILD/soak/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUILD=$(cd "$BUILD" && pwd)

select=()
[ -n "$FILTER" ] && select=(-R "$FILTER")
count=$(ctest --test-dir "$BUILD" -N "${select[@]}" "${EXTRA[@]}" | sed -n 's/^Total Tests: //p')
[ "${count:-0}" -gt 0 ] || { echo "soak.sh: no test in $BUILD matches '${FILTER}'" >&2; exit 2; }

# The load: busy loops, each its own process (ended by their ids on exit, however we leave), and
# with --beside the rest of the suite, in its own process group (ctest and the tests it started).
loaders=()
beside_group=""
stop_load() {
  for p in "${loaders[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -z "$beside_group" ] || kill -- "-$beside_group" 2>/dev/null || true
}
trap stop_load EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < LOAD; i++)); do
  bash -c 'while :; do :; done' &
  loaders+=($!)
done

focus_jobs=$JOBS
if [ "$BESIDE" = 1 ]; then
  focus_jobs=1
  rest=$(ctest --test-dir "$BUILD" -N -E "$FILTER" "${EXTRA[@]}" | sed -n 's/^Total Tests: //p')
  # Each completed run of the rest: beside-K.xml (written under another name until ctest is done,
  # so that the run stopped at the end leaves nothing to count) and, with a failure, beside-K.log.
  setsid bash -c '
    build=$1 filter=$2 jobs=$3 timeout=$4 out=$5; shift 5
    for ((k = 1; ; k++)); do
      rc=0
      ctest --test-dir "$build" -E "$filter" -j "$jobs" --schedule-random --timeout "$timeout" \
        --output-on-failure --output-junit "$out/beside-$k.part" "$@" > "$out/beside-$k.log" 2>&1 || rc=$?
      mv "$out/beside-$k.part" "$out/beside-$k.xml"
      [ $rc -ne 0 ] || rm -f "$out/beside-$k.log"
    done' soak-beside "$BUILD" "$FILTER" $((JOBS - 1)) "$TIMEOUT" "$OUT" "${EXTRA[@]}" &
  beside_group=$!
  echo "soak.sh: $N runs of $count tests (filter '$FILTER') one at a time, beside the other $rest tests over and over at -j$((JOBS - 1)), $LOAD busy loops; logs in $OUT"
else
  echo "soak.sh: $N runs of $count tests (filter '${FILTER:-<all>}') in $BUILD, -j$JOBS, $LOAD busy loops; logs in $OUT"
fi
t0=$SECONDS
failed_runs=0
for ((k = 1; k <= N; k++)); do
  s=$SECONDS
  rc=0
  ctest --test-dir "$BUILD" "${select[@]}" -j "$focus_jobs" --schedule-random --timeout "$TIMEOUT" --output-on-failure \
    --output-junit "$OUT/run-$k.xml" "${EXTRA[@]}" > "$OUT/run-$k.log" 2>&1 || rc=$?
  summary=$(grep -E '^[0-9]+% tests passed' "$OUT/run-$k.log" || echo "ctest exited $rc")
  if [ $rc -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    # (with --beside, two ctests share the build's LastTest.log: run-K.log has the failed output)
    [ "$BESIDE" = 1 ] || cp "$BUILD/Testing/Temporary/LastTest.log" "$OUT/run-$k.LastTest.log" 2>/dev/null || true
    echo "soak.sh: run $k/$N: $summary ($((SECONDS - s)) s), kept run-$k.log"
  else
    rm -f "$OUT/run-$k.log"
    echo "soak.sh: run $k/$N: $summary ($((SECONDS - s)) s)"
  fi
done

if [ "$BESIDE" = 1 ]; then
  kill -- "-$beside_group" 2>/dev/null || true
  wait "$beside_group" 2>/dev/null || true
  beside_group=""
  rm -f "$OUT"/beside-*.part
  # The run that was stopped has no JUnit file: what it completed is read from its log, kept as
  # beside-K.stopped.log when a test failed in it.
  for log in "$OUT"/beside-*.log; do
    [ -e "$log" ] && [ ! -e "${log%.log}.xml" ] || continue
    done_n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$log" || true)
    failed=$(grep -E '^ *[0-9]+/[0-9]+ Test +#' "$log" | grep -vE ' Passed |\*\*\*(Skipped|Not Run)' | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .*\*\*\*([A-Za-z]+(: [A-Za-z]+)?).*/\1 (\2)/' || true)
    if [ -n "$failed" ]; then
      mv "$log" "${log%.log}.stopped.log"
      beside_stopped_failed=1
      echo "soak.sh: the rest's last run, stopped at the end, had completed $done_n tests; failed:"
      echo "$failed" | sed 's/^/  /'
    else
      rm -f "$log"
      echo "soak.sh: the rest's last run, stopped at the end, had completed $done_n tests, none failed"
    fi
  done
fi

# Per test, over the runs' JUnit files: passed / failed (failed, timed out, crashed) / not run.
summarize() {
python3 - "$OUT" "$1" "$2" <<'EOF'
import glob, os, re, sys
import xml.etree.ElementTree as ET
out, prefix, label = sys.argv[1], sys.argv[2], sys.argv[3]
runs_seen = sorted(int(re.search(r"-(\d+)\.xml$", p).group(1)) for p in glob.glob(os.path.join(out, f"{prefix}-*.xml")))
counts = {}  # name -> [passed, failed, not run, "run: how" for each failure]
for run in runs_seen:
    path = os.path.join(out, f"{prefix}-{run}.xml")
    how = {}  # from ctest's own log of a failed run: Failed, Timeout, Exception: SegFault, ...
    log = os.path.join(out, f"{prefix}-{run}.log")
    if os.path.exists(log):
        for m in re.finditer(r"Test +#\d+: (\S+).*?\*\*\*(\w+(?:: \w+)?)", open(log, errors="replace").read()):
            how[m.group(1)] = m.group(2)
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name").split()[0]  # without a parameterized test's "# GetParam() = ..."
        c = counts.setdefault(name, [0, 0, 0, []])
        if case.find("failure") is not None or case.find("error") is not None:
            c[1] += 1
            c[3].append((run, how.get(name, "failed")))
        elif case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            c[2] += 1
        else:
            c[0] += 1
width = max([len(k) for k in counts] + [4])
print(f"{'test':<{width}}  passed  failed  not run")
for name, (p, f, s, runs) in sorted(counts.items(), key=lambda kv: (-kv[1][1], kv[0])):
    where = f"  (run {', '.join(f'{k}: {h}' for k, h in sorted(runs))})" if runs else ""
    print(f"{name:<{width}}  {p:6d}  {f:6d}  {s:7d}{where}")
bad = sum(1 for c in counts.values() if c[1])
print(f"soak.sh: {label}: {len(counts)} tests x {len(runs_seen)} runs: {sum(c[1] for c in counts.values())} failures in {bad} tests")
sys.exit(1 if bad else 0)
EOF
}
beside_bad=${beside_stopped_failed:-0}
if [ "$BESIDE" = 1 ]; then
  if ls "$OUT"/beside-*.xml > /dev/null 2>&1; then
    summarize beside "the rest of the suite beside them" || beside_bad=1
  else
    echo "soak.sh: the rest of the suite completed no run beside them"
  fi
  echo
fi
summarize run "${FILTER:-every test}" || true
echo "soak.sh: $failed_runs of $N runs had a failure, $((SECONDS - t0)) s; logs in $OUT"
[ "$beside_bad" -eq 0 ] || echo "soak.sh: and the rest of the suite beside them had a failure (above)"
[ "$failed_runs" -eq 0 ] && [ "$beside_bad" -eq 0 ]
