#!/usr/bin/env bash
# Runs chosen CTest tests N times beside each other, under load, and counts failures per test:
# a test that fails one time in twenty shows up here, not in CI.
#   scripts/soak.sh [N] [FILTER]    N runs (default 10) of the tests matching the CTest regex
#                                   FILTER (default: every test) in a built folder
# Each run is one `ctest -R FILTER -j JOBS --schedule-random`: the selected tests run side by side
# in a new random order every time. At the end: one line per test (passed, failed, not run, and
# for a failing test the runs it failed in and how: Failed, Timeout, Exception), then the totals;
# exit 1 if any test failed (2 on bad arguments or when no test matches). The output of every
# run with a failure is kept:
# run-K.log (ctest's, with each failed test's output) and run-K.LastTest.log (every test's
# output) in the folder named at the start and the end; every run's run-K.xml (JUnit) too.
# Environment:
#   AIACC_BUILD_DIR     build folder (default build/, as scripts/test.sh)
#   AIACC_SOAK_JOBS     tests at once (default 2, CI's -j)
#   AIACC_SOAK_LOAD     busy-loop processes beside the tests, one core each (default 0)
#   AIACC_SOAK_TIMEOUT  seconds per test before ctest kills it (default 600, CI's)
#   AIACC_SOAK_OUT      where the logs go (default BUILD/soak/<date-time>)
#   extra ctest arguments after `--`: scripts/soak.sh 20 'Autotune' -- -L comm
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

N=10
FILTER=""
EXTRA=()
pos=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
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

# The load: busy loops, each its own process (ended by their ids on exit, however we leave).
loaders=()
stop_load() { for p in "${loaders[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_load EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < LOAD; i++)); do
  bash -c 'while :; do :; done' &
  loaders+=($!)
done

echo "soak.sh: $N runs of $count tests (filter '${FILTER:-<all>}') in $BUILD, -j$JOBS, $LOAD busy loops; logs in $OUT"
t0=$SECONDS
failed_runs=0
for ((k = 1; k <= N; k++)); do
  s=$SECONDS
  rc=0
  ctest --test-dir "$BUILD" "${select[@]}" -j "$JOBS" --schedule-random --timeout "$TIMEOUT" --output-on-failure \
    --output-junit "$OUT/run-$k.xml" "${EXTRA[@]}" > "$OUT/run-$k.log" 2>&1 || rc=$?
  summary=$(grep -E '^[0-9]+% tests passed' "$OUT/run-$k.log" || echo "ctest exited $rc")
  if [ $rc -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    cp "$BUILD/Testing/Temporary/LastTest.log" "$OUT/run-$k.LastTest.log" 2>/dev/null || true
    echo "soak.sh: run $k/$N: $summary ($((SECONDS - s)) s), kept run-$k.log"
  else
    rm -f "$OUT/run-$k.log"
    echo "soak.sh: run $k/$N: $summary ($((SECONDS - s)) s)"
  fi
done

# Per test, over the runs' JUnit files: passed / failed (failed, timed out, crashed) / not run.
python3 - "$OUT" "$N" <<'EOF'
import glob, os, re, sys
import xml.etree.ElementTree as ET
out, n = sys.argv[1], int(sys.argv[2])
counts = {}  # name -> [passed, failed, not run, "run: how" for each failure]
for path in glob.glob(os.path.join(out, "run-*.xml")):
    run = int(re.search(r"run-(\d+)\.xml$", path).group(1))
    how = {}  # from ctest's own log of a failed run: Failed, Timeout, Exception: SegFault, ...
    log = os.path.join(out, f"run-{run}.log")
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
print(f"soak.sh: {len(counts)} tests x {n} runs: {sum(c[1] for c in counts.values())} failures in {bad} tests")
EOF
echo "soak.sh: $failed_runs of $N runs had a failure, $((SECONDS - t0)) s; logs in $OUT"
[ "$failed_runs" -eq 0 ]
