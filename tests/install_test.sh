#!/usr/bin/env bash
# aiacc::comm as another project sees it: install this build into a temporary prefix, then
#   1. only aiacc/ is under the prefix's include/, with config.h, and the libraries are there;
#      the private headers are not (aiacc_train's protocol, the library's parts), and
#      aiacc::comm_testing's are;
#   2. the package's version file accepts 0.1 and refuses 0.2 and 1.0;
#   3. aiacc/config.h refuses a compilation with the other libstdc++ C++ ABI (and so does every
#      public header, through it: tests/consumer/'s other_abi target, built after step 4);
#   4. examples/ddp_minimal builds against the prefix (find_package(aiacc)), and so does
#      tests/consumer/: the example's program inside the consumer's own shared library (aiacc::comm,
#      static) and beside libaiacc_comm.so (aiacc::comm_shared). (The build itself compiles every
#      installed header on its own: cmake/HeadersAlone.cmake.)
#   5. the example trains on one process (train), on 2 processes started by torchrun (PYTHON -m
#      torch.distributed.run, the release this build is against) and by plain RANK/WORLD_SIZE/
#      MASTER_ADDR/MASTER_PORT, and alone without a launcher; the consumer's two programs on 2
#      processes; and the consumer's fault program (aiacc::comm_testing), where both ranks exit 1
#      and rank 0's one-line error names rank 1, whose operation failed. Both ranks end with identical parameters, within 1e-6 of the one-process run on
#      the whole batch; alone, train_ddp gives train's parameters exactly;
#   6. with OTHER_TORCH_DIR (a LibTorch of another version), find_package(aiacc) refuses it,
#      naming both versions; with TORCH_PREFIX too, it refuses this build's Torch_DIR alone, whose
#      TorchConfig then finds the other LibTorch's Caffe2 half in the system's folders.
# TORCH_PREFIX: the LibTorch's prefix, for CMAKE_PREFIX_PATH ("-": a system LibTorch).
# Usage: install_test.sh BUILD_DIR WORK_DIR PYTHON OTHER_TORCH_DIR|- TORCH_PREFIX|- [cmake args...]
set -euo pipefail
[ $# -ge 5 ] || { echo "usage: $0 BUILD_DIR WORK_DIR PYTHON OTHER_TORCH_DIR|- TORCH_PREFIX|- [cmake args...]" >&2; exit 2; }
build=$1 work=$2 python=$3 other_torch=$4 torch_prefix=$5
shift 5
prefixes=$work/prefix
[ "$torch_prefix" != - ] && prefixes="$prefixes;$torch_prefix"
here=$(cd "$(dirname "$0")" && pwd)
example=$(cd "$here/../examples/ddp_minimal" && pwd)
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
echo "install_test: installed $(find "$prefix" -type f | wc -l) files into $prefix"

# 1.
top=$(ls -A "$prefix/include")
[ "$top" = aiacc ] || fail "include/ holds '$(echo $top)', not aiacc/ alone"
[ -f "$prefix/include/aiacc/config.h" ] || fail "no aiacc/config.h"
for lib in libaiacc_comm.a libaiacc_common.a libaiacc_comm.so; do
  [ -e "$prefix/lib/$lib" ] || fail "no lib/$lib"
done
# Only the public surface is installed (cmake/Install.cmake): aiacc_train's own protocol and the
# library's parts stay inside it.
for h in membership.h key_log.h launch_env.h reducer.h store.h factory.h gloo_transport.h shm_transport.h; do
  if [ -e "$prefix/include/aiacc/comm/$h" ]; then fail "aiacc/comm/$h is installed: a private header"; fi
done
[ -f "$prefix/include/aiacc/comm/fault_transport.h" ] || fail "no aiacc/comm/fault_transport.h (aiacc::comm_testing)"
[ -e "$prefix/lib/libaiacc_comm_testing.a" ] || fail "no lib/libaiacc_comm_testing.a"

# 2.
cat > "$work/version_check.cmake" <<'EOS'
set(PACKAGE_FIND_VERSION ${want})
string(REPLACE "." ";" parts ${want})
list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
set(PACKAGE_FIND_VERSION_PATCH 0)
set(PACKAGE_FIND_VERSION_COUNT 2)
set(CMAKE_SIZEOF_VOID_P 8)
include(${file})
message("${PACKAGE_VERSION_COMPATIBLE}")
EOS
for want in 0.1:TRUE 0.2:FALSE 1.0:FALSE; do
  got=$(cmake -Dwant="${want%%:*}" -Dfile="$prefix/lib/cmake/aiacc/aiaccConfigVersion.cmake" -P "$work/version_check.cmake" 2>&1)
  [ "$got" = "${want##*:}" ] || fail "the version file says compatible=$got for ${want%%:*}, expected ${want##*:}"
done

# 3.
abi=$(sed -n 's/^#define AIACC_CXX11_ABI \([01]\)$/\1/p' "$prefix/include/aiacc/config.h")
echo '#include "aiacc/config.h"' > "$work/abi.cc"
c++ -std=c++17 -fsyntax-only -I"$prefix/include" -D_GLIBCXX_USE_CXX11_ABI=$((1 - abi)) "$work/abi.cc" > "$work/abi.log" 2>&1 &&
  fail "aiacc/config.h accepted _GLIBCXX_USE_CXX11_ABI=$((1 - abi))"
grep -q "another _GLIBCXX_USE_CXX11_ABI" "$work/abi.log" || { cat "$work/abi.log"; fail "the ABI refusal does not say why"; }
c++ -std=c++17 -fsyntax-only -I"$prefix/include" -D_GLIBCXX_USE_CXX11_ABI=$abi "$work/abi.cc" || fail "aiacc/config.h refused its own ABI"

# 4.
# Through ccache where there is one, set as the project's own build sets it (CMakeLists.txt): every
# path here is under the project's folder, so another clone's build of the same sources hits.
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=$(cd "$here/.." && pwd) CCACHE_NOHASHDIR=1
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
project() {  # NAME SOURCE_DIR [cmake args...]
  local name=$1 src=$2
  shift 2
  cmake -S "$src" -B "$work/$name" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefixes" "${launcher[@]}" "$@" \
    > "$work/$name.configure.log" 2>&1 || { cat "$work/$name.configure.log"; fail "configuring $name"; }
  cmake --build "$work/$name" -j 2 > "$work/$name.build.log" 2>&1 || { tail -50 "$work/$name.build.log"; fail "building $name"; }
}
project example "$example" "$@"
project consumer "$here/consumer" -DAIACC_EXAMPLE_DIR="$example" "$@"
echo "install_test: the example and the consumer compiled"
cmake --build "$work/consumer" --target other_abi > "$work/other_abi.log" 2>&1 &&
  fail "aiacc/comm/data_parallel.h compiled with the other C++ ABI"
grep -q "another _GLIBCXX_USE_CXX11_ABI" "$work/other_abi.log" || { cat "$work/other_abi.log"; fail "data_parallel.h's ABI refusal does not say why"; }
needed() { readelf -d "$1" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'; }
needed "$work/consumer/consumer_shared" | grep -q '^libaiacc_comm\.so' || fail "consumer_shared does not load libaiacc_comm.so"
needed "$work/consumer/libconsumer_ddp.so" | grep -q '^libaiacc_comm\.so' && fail "libconsumer_ddp.so loads libaiacc_comm.so: the static library was not linked in"
needed "$work/example/train_ddp" | grep -q '^libaiacc_comm\.so' && fail "train_ddp loads libaiacc_comm.so: aiacc::comm is the static library"

# 5.
out=$work/params
mkdir -p "$out"
run() {  # LOG COMMAND...: runs it, shows its output, fails with it
  local log=$1
  shift
  timeout 120 "$@" > "$log" 2>&1 || { cat "$log"; fail "$*"; }
}
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
trap 'kill "${pids[@]}" 2> /dev/null || true' EXIT  # a failed rank's peer does not outlive the test
by_env() {  # PROGRAM OUT: 2 ranks through the variables a launcher sets
  local prog=$1 dest=$2 port r
  port=$(free_port)
  pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$prog" "$dest" > "$dest.log$r" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || { cat "$dest".log*; fail "$prog rank $r (RANK/WORLD_SIZE)"; }; done
}
run "$out/single.log" "$work/example/train" "$out/single"
# No launcher's variable at all (not even a Slurm or MPI job's around this test).
run "$out/alone.log" env -i PATH="$PATH" HOME="$HOME" "$work/example/train_ddp" "$out/alone"
# -r 1 -t 1 --log_dir: Debian's torch 1.13 under Python 3.11 fails on its defaults (-r 0 -t 0).
run "$out/torchrun.log" "$python" -m torch.distributed.run --standalone --no_python --nproc_per_node 2 -r 1 -t 1 \
  --log_dir "$out/torchrun_logs" "$work/example/train_ddp" "$out/torchrun"
by_env "$work/example/train_ddp" "$out/env"
# The AIACC_* variables reach DataParallel's options: one bucket per parameter, the same sums.
# (The consumer's hook program: the explicit step, and it prints DataParallel::describe().)
(export AIACC_BUCKET_MB=0.0001 AIACC_FIRST_BUCKET_MB=0.0001; by_env "$work/consumer/consumer_hook" "$out/buckets") || exit 1
grep -q "4 buckets" "$out/buckets.log0" || { cat "$out/buckets.log0"; fail "AIACC_BUCKET_MB did not make 4 buckets"; }
# The example's own compression through a comm hook: fp16 on the wire.
(export DDP_MINIMAL_FP16=1; by_env "$work/consumer/consumer_hook" "$out/fp16") || exit 1
grep -q "comm hook fp16-compress" "$out/fp16.log0" || { cat "$out/fp16.log0"; fail "the example's comm hook was not used"; }
by_env "$work/consumer/consumer" "$out/consumer"
# aiacc::comm_testing: rank 1's 20th operation fails (FaultTransport). Each rank prints one line and
# exits 1 (the example's way); rank 0, whose peer left mid-step, names rank 1.
port=$(free_port)
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 "$work/consumer/consumer_fault" > "$out/fault.log$r" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  rc=0
  wait "${pids[$r]}" || rc=$?
  [ $rc = 1 ] || { cat "$out"/fault.log*; fail "consumer_fault: rank $r exited $rc, not 1 (an error)"; }
done
grep -q "^error: injected failure of operation 20" "$out/fault.log1" || { cat "$out/fault.log1"; fail "rank 1 did not report its injected failure"; }
grep "^error: " "$out/fault.log0" | grep -q "rank 1" || { cat "$out/fault.log0"; fail "rank 0's error does not name rank 1"; }
echo "install_test: a fault injected on rank 1: rank 0 says $(grep -h '^error: ' "$out/fault.log0")"
by_env "$work/consumer/consumer_shared" "$out/consumer_shared"
"$python" - "$out" <<'EOS' || fail "the parameters differ (above)"
import sys
out = sys.argv[1]
read = lambda name: [float(v) for v in open(f"{out}/{name}")]
single = read("single")
assert len(single) == 8 * 32 + 32 + 32 + 1, len(single)
ok = True
if read("alone.0") != single:
    print("train_ddp without a launcher does not give train's parameters exactly"); ok = False
for run in ("torchrun", "env", "buckets", "consumer", "consumer_shared", "fp16"):
    r0, r1 = read(f"{run}.0"), read(f"{run}.1")
    diff = max(abs(a - b) for a, b in zip(r0, single))
    same = r0 == r1
    print(f"install_test: {run}: ranks {'identical' if same else 'DIFFERENT'}, max |2 ranks - 1 process| = {diff:.3g}")
    # fp16 on the wire: each averaged gradient rounded to 11 significant bits, 30 steps of it.
    ok = ok and same and (diff <= 1e-6 if run != "fp16" else 0 < diff <= 1e-2)
sys.exit(0 if ok else 1)
EOS
echo "install_test: one process: $(grep -h 'step 30' "$out/single.log"); rank 0 of 2, on its half: $(grep -h 'step 30' "$out/env.log0")"

# 6.
if [ "$other_torch" != - ]; then
  if cmake -S "$example" -B "$work/refused" -DCMAKE_PREFIX_PATH="$prefix" -DTorch_DIR="$other_torch" \
       > "$work/refused.log" 2>&1; then
    fail "find_package(aiacc) accepted the LibTorch at $other_torch"
  fi
  grep -q "was built against LibTorch" "$work/refused.log" || { cat "$work/refused.log"; fail "the refusal does not name the versions"; }
  echo "install_test: refused a LibTorch of another version: $(tr -s ' \n' ' ' < "$work/refused.log" | grep -o 'aiacc [0-9.]* was built against LibTorch [^,]*, and this project found LibTorch [0-9.a-z+]*')"
  if [ "$torch_prefix" != - ]; then
    if cmake -S "$example" -B "$work/mixed" -DCMAKE_PREFIX_PATH="$prefix" "$@" > "$work/mixed.log" 2>&1; then
      fail "find_package(aiacc) accepted a Torch_DIR whose Caffe2 half is another LibTorch's"
    fi
    grep -q "found the Caffe2 config of another LibTorch" "$work/mixed.log" || { cat "$work/mixed.log"; fail "the mixed LibTorch is not named"; }
    echo "install_test: refused Torch_DIR alone, with another LibTorch's Caffe2 in the system's folders"
  fi
fi
echo "install_test: passed"
