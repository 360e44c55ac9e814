#!/usr/bin/env bash
# Runs the test suite in five build configurations, one after the other: set up packages if
# needed, check the C++ formatting, build, run every CTest test.
#   1. debian: Debian's LibTorch 1.13 (CPU, with the system Gloo) in build/;
#   2. torch2: the pip LibTorch 2.11 with CUDA 13.0 (scripts/torch2.sh) in build-torch2/, C++20,
#      without GlooTransport (comm/CMakeLists.txt says why); its checkpoints are checked against
#      build/'s both ways (CheckpointCompat.AcrossBuilds).
#   3. asan, 4. tsan: the comm and data tests (CTest labels "comm", "data")
#      with aiacc's own code built with -fsanitize=address (with LeakSanitizer) or
#      -fsanitize=thread against Debian's LibTorch, in build-asan/ and build-tsan/
#      (-DAIACC_SANITIZE builds only the comm and data libraries and their tests). The
#      dependencies (LibTorch, Gloo, libjpeg-turbo, OpenCV) are not instrumented;
#      tests/sanitizers/ holds the suppressions, each naming the dependency it is about.
#   5. fuzz: every fuzz target (fuzz/, scripts/fuzz.sh --ci) over its seeds and the inputs that
#      once crashed it, then AIACC_FUZZ_SECONDS (45) of fresh fuzzing each, two at a time, built
#      with clang's libFuzzer, ASan and UBSan in build-fuzz/.
# Each configuration's ctest output is kept in its build folder (ctest.log), and its five slowest
# CTest tests (a GoogleTest suite is one, but for the tests labelled "process") and the GoogleTest
# tests that skipped are printed after it.
# AIACC_CONFIGS="debian" (or "torch2", "asan tsan", ...) runs those; extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The sanitizer configurations last. Fresh-clone CI of be76072 on 2 cores, 42 min in all: debian
# build 234 s + tests ~380 s, torch2 274 s + ~390 s, asan (file by file) 625 s + 168 s, tsan
# (unity) 201 s + 214 s.
CONFIGS=${AIACC_CONFIGS:-debian torch2 asan tsan fuzz}
# The pip LibTorch 2.x is set up only for the torch2 configuration.
case " $CONFIGS " in *" torch2 "*) ;; *) export AIACC_SKIP_TORCH2=${AIACC_SKIP_TORCH2:-1} ;; esac
scripts/setup.sh
# Formatting first: every C++ file follows .clang-format (scripts/format_check.sh names the ones
# that do not, with the command that fixes them).
scripts/format_check.sh
# ctest in DIR with the given arguments, its output kept in DIR/ctest.log; then the five slowest
# tests, from that output, whether or not every test passed.
run_ctest() {
  local dir=$1 rc=0
  shift
  (cd "$dir" && ctest --output-on-failure -j "${AIACC_TEST_JOBS:-2}" --timeout 600 "$@") 2>&1 | tee "$dir/ctest.log" ||
    rc=$?
  echo "test.sh: the five slowest tests in $dir:"
  sed -n 's/^ *[0-9]*\/[0-9]* *Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' "$dir/ctest.log" |
    sort -rn | awk 'NR <= 5 { printf "  %7.1f s  %s\n", $1, $2 }'
  # The GoogleTest tests that skipped (GTEST_SKIP): a suite runs as one CTest test, which passes
  # when some of its tests pass and the others skip (cmake/GTestGroups.cmake), so each is named here.
  local skipped
  skipped=$(sed -n 's/^\[  SKIPPED \] \([^ ]*\.[^ ]*\) (.*/\1/p' "$dir/Testing/Temporary/LastTest.log" 2>/dev/null |
    sort -u) || true
  [ -z "$skipped" ] || { echo "test.sh: skipped in $dir:"; sed 's/^/  /' <<<"$skipped"; }
  # The share of the tests that start a job's real processes (CTest label "process", tests/CMakeLists.txt).
  local process
  process=$(cd "$dir" && ctest -N -L process | sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p') || true
  sed -n 's/^ *[0-9]*\/[0-9]* *Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' "$dir/ctest.log" |
    awk -v names="$process" 'BEGIN { n = split(names, a, "\n"); for (i = 1; i <= n; ++i) p[a[i]] = 1 }
      { all += $1; ++count; if ($2 in p) { mine += $1; ++k } }
      END { printf "test.sh: %d of the %d tests in '"$dir"' are labelled process; %.0f s of their %.0f s\n", k, count, mine, all }'
  return $rc
}
t0=$SECONDS
for c in $CONFIGS; do
  case "$c" in
    debian)
      s=$SECONDS
      scripts/build.sh
      echo "test.sh: debian build: $((SECONDS - s)) s"
      run_ctest "${AIACC_BUILD_DIR:-build}" "$@"
      ;;
    torch2)
      s=$SECONDS
      peer=()
      [ -x build/tests/aiacc_checkpoint_tool ] && peer=(-DAIACC_PEER_BUILD_DIR="$PWD/build")
      AIACC_BUILD_DIR=build-torch2 scripts/build.sh --torch2 "${peer[@]}"
      echo "test.sh: torch2 build: $((SECONDS - s)) s"
      run_ctest build-torch2 "$@"
      ;;
    asan|tsan)
      s=$SECONDS
      supp=$PWD/tests/sanitizers
      if [ "$c" = asan ]; then
        san=address
        # Stop at the first error. LeakSanitizer runs at exit: a leak fails the test unless every
        # allocation in it is a dependency's (lsan.supp; none so far: what LibTorch's and Gloo's
        # static initialisation allocates stays reachable, so it is not reported).
        env=(ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1
             LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0)
      else
        san=thread
        # OMP_NUM_THREADS=1: LibTorch's intra-op parallelism (OpenMP in Debian's build) would
        # otherwise hand our tensors to uninstrumented threads that synchronize where TSan cannot
        # see it, and every such hand-off would read as a race. With one thread, at::parallel_for
        # runs inline; aiacc's own threads (channel workers, loader workers) are all instrumented.
        env=(TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp OMP_NUM_THREADS=1)
      fi
      # ASan builds file by file (every other configuration is a unity build, CMakeLists.txt): a
      # source that compiles only because an earlier one in its unit included what it needs
      # fails here (comm, data, models and common; not app/).
      unity=ON
      [ "$c" = asan ] && unity=OFF
      AIACC_BUILD_DIR=build-$c scripts/build.sh -DAIACC_SANITIZE=$san -DAIACC_UNITY_BUILD=$unity
      echo "test.sh: $c build: $((SECONDS - s)) s"
      s=$SECONDS
      (export "${env[@]}" && run_ctest "build-$c" -L '^(comm|data)$' "$@")
      echo "test.sh: $c tests: $((SECONDS - s)) s"
      ;;
    fuzz)
      s=$SECONDS
      scripts/fuzz.sh --ci "${AIACC_FUZZ_SECONDS:-45}"
      echo "test.sh: fuzz: $((SECONDS - s)) s"
      ;;
    *) echo "test.sh: unknown configuration '$c' (debian, torch2, asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
done
echo "test.sh: $CONFIGS passed in $((SECONDS - t0)) s"
