#!/usr/bin/env bash
# The GPU check, in one command on the GPU host (under 8 minutes): configure aiacc against the
# CUDA LibTorch inside Python's torch plus gpu-bundle/ (scripts/gpu/bundle.sh, made beforehand on
# a machine with apt and carried along), build, run the GPU tests, then the benchmarks, and print
# one table:
#   - ResNet-50 training images/s on one GPU, synthetic data, batch 256, AMP, channels-last:
#     aiacc_train beside a PyTorch eager script doing the same (scripts/gpu/bench_eager.py);
#   - the data pipeline on the host's cores: decode + augment of a generated photo-sized JPEG set
#     at 224, images/s per core and in all, against the training rate it has to feed.
#   - preemption on the GPU: aiacc_train --gpus 1 (AMP fp16) stopped by a real SIGTERM mid-epoch,
#     then --resume auto: the exit status, the saved step, the loss scale and CUDA generator state
#     in the checkpoint, and every step of the job trained once.
# Logs and the reports go to /tmp/aiacc-gpu-check, and with $OUT set (the device tool's folder)
# also into $OUT/check-logs.tgz. --skip-build uses build-gpu/ as it is: built beforehand, here or on a machine with the
# same torch (AIACC_BUILD_DIR=build-gpu scripts/build.sh --torch2 -DOPENCV_IMGCODECS_LIB=OFF, the
# bundle's OpenCV having no imgcodecs), its binaries carried along.
#   scripts/gpu/check.sh [--skip-build] [--steps N]
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
# Logs go to a folder of their own; with $OUT (the device tool's, which brings back a few files
# only) they come back as one archive, check-logs.tgz.
OUTDIR=/tmp/aiacc-gpu-check
rm -rf "$OUTDIR"; mkdir -p "$OUTDIR"
STEPS=60
SKIP_BUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-build) SKIP_BUILD=1 ;;
    --steps) STEPS=$2; shift ;;
    *) echo "check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "[check $(date +%H:%M:%S)] $*"; }

BUNDLE=$ROOT/gpu-bundle
[ -d "$BUNDLE/usr/include" ] || { echo "check.sh: $BUNDLE missing: run scripts/gpu/bundle.sh on a machine with apt and carry gpu-bundle" >&2; exit 1; }
PY=${PYTHON:-python3}
TORCH_DIR=$($PY -c 'import os, torch; print(os.path.dirname(torch.__file__))') || { echo "check.sh: python3 has no torch" >&2; exit 1; }
SITE=$(dirname "$TORCH_DIR")
# NCCL and cuDNN as the torch wheel loads them (pip's nvidia-* packages), else the toolkit's.
NCCL_H=$(find "$SITE/nvidia" -name nccl.h 2>/dev/null | head -1)
NCCL_LIB=$(find "$SITE/nvidia" -name 'libnccl.so*' 2>/dev/null | head -1)
CUDNN_H=$(find "$SITE/nvidia" -name cudnn.h 2>/dev/null | head -1)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
LIBDIRS="$BUNDLE/usr/lib/x86_64-linux-gnu:$BUNDLE/usr/lib:$TORCH_DIR/lib"
[ -n "$NCCL_LIB" ] && LIBDIRS="$LIBDIRS:$(dirname "$NCCL_LIB")"
# The CUDA runtime as the wheel ships it, then the toolkit's: binaries built on another machine
# name the runtime by soname only.
for d in "$SITE"/nvidia/*/lib "$CUDA_HOME/lib64"; do [ -d "$d" ] && LIBDIRS="$LIBDIRS:$d"; done
export LD_LIBRARY_PATH=$LIBDIRS:${LD_LIBRARY_PATH:-}
{
  say "torch $($PY -c 'import torch; print(torch.__version__, torch.version.cuda)') at $TORCH_DIR"
  say "nccl.h: ${NCCL_H:-none}; libnccl: ${NCCL_LIB:-none}; cudnn.h: ${CUDNN_H:-none}; nvcc: $(command -v nvcc || echo none)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
  echo "cores: $(nproc)"
} | tee "$OUTDIR/summary.txt"

source "$ROOT/scripts/torch2.sh"
{ echo "what this host's torch is (scripts/torch2.sh torch2_facts):"; torch2_facts "$SITE"; } | tee -a "$OUTDIR/summary.txt"
mapfile -t TORCH2_ARGS < <(torch2_cmake_args "$SITE")

BUILD=$ROOT/build-gpu
if [ "$SKIP_BUILD" = 0 ]; then
  say "configure (the 2.x configuration of CI: scripts/torch2.sh torch2_cmake_args, plus gpu-bundle/)"
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${TORCH2_ARGS[@]}" \
    -DCMAKE_PREFIX_PATH="$TORCH_DIR;$BUNDLE/usr;$BUNDLE/usr/lib/x86_64-linux-gnu/cmake;$BUNDLE/usr/share/cmake" \
    -DCMAKE_CXX_FLAGS="-isystem $BUNDLE/usr/include/x86_64-linux-gnu" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$BUNDLE/usr/lib/x86_64-linux-gnu" \
    > "$OUTDIR/configure.log" 2>&1
  rc=$?
  grep -E "aiacc:|CMake Error|Could NOT" "$OUTDIR/configure.log" | head -20
  [ $rc -eq 0 ] || { say "configure FAILED (tail of $OUTDIR/configure.log):"; tail -40 "$OUTDIR/configure.log"; exit 1; }
  say "build ($(nproc) jobs; keeps going past errors so one run shows them all)"
  cmake --build "$BUILD" -j "$(nproc)" -- $([ ${#GEN[@]} -gt 0 ] && echo "-k 0" || echo "-k") > "$OUTDIR/build.log" 2>&1
  rc=$?
  grep -E "error|Error" "$OUTDIR/build.log" | head -40
  [ $rc -eq 0 ] || say "build had errors (full log: $OUTDIR/build.log); running what was built"
fi

FAIL=0
if [ -x "$BUILD/tests/aiacc_tests" ]; then
  say "GPU tests"
  # Bounded: a hang must not hold the GPU host past the call.
  (cd "$BUILD/tests" && timeout 300 ./aiacc_tests --gtest_filter='Gpu.*:GradScaler.*:Autocast.*' 2>&1;
   echo "aiacc_tests exit $?"; timeout 120 ./aiacc_data_tests --gtest_filter='LoaderTest.*:Decode.*' 2>&1;
   echo "aiacc_data_tests exit $?") \
    | tee "$OUTDIR/tests.log" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Failure|error" | head -40
  grep -E "^abort and re-create|^free device memory|^GPU resume|^multi-tensor|tests exit" "$OUTDIR/tests.log"
  grep -q "FAILED" "$OUTDIR/tests.log" && FAIL=1
  grep -qE "tests exit [1-9]" "$OUTDIR/tests.log" && FAIL=1
else
  say "no test binary"; FAIL=1
fi

TRAIN=$BUILD/app/aiacc_train
aiacc_ips=""; eager_ips=""; data_ips=""; jpeg_ips=""
preempt=""
if [ -x "$TRAIN" ]; then
  say "preemption: aiacc_train --gpus 1 (AMP fp16) SIGTERMed after 12 steps, then --resume auto"
  P=/tmp/aiacc-preempt
  rm -rf "$P"
  "$TRAIN" --make-sample "$P/ds" > /dev/null 2>&1
  job=("$TRAIN" --gpus 1 --data "$P/ds" --arch resnet18 --batch-size 32 --image-size 64 --epochs 2
       --cudnn-benchmark=false --checkpoint-dir "$P/ck" --metrics-file "$P/m.jsonl" --progress-seconds 1000)
  timeout 120 "${job[@]}" > "$OUTDIR/preempt.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ "$(cat "$P/m.jsonl" 2>/dev/null | grep -c '"step"')" -ge 12 ] && break; sleep 0.1; done
  kill -TERM $pid
  wait $pid
  rc1=$?
  timeout 120 "${job[@]}" --resume auto >> "$OUTDIR/preempt.log" 2>&1
  rc2=$?
  grep -E "stopped by|resumed from|error" "$OUTDIR/preempt.log" | head -6
  saved=$(sed -n 's/.*stopped by SIGTERM after step \([0-9]*\); saved.*/\1/p' "$OUTDIR/preempt.log" | head -1)
  preempt=$($PY - "$P" "$rc1" "$rc2" "${saved:-0}" <<'PYEOF' 2>&1 | tail -1
import json, sys, torch
p, rc1, rc2, saved = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
steps = [j["step"] for j in map(json.loads, open(p + "/m.jsonl")) if j.get("type") == "step"]
t = torch.load(f"{p}/ck/step-{saved:012d}.ckpt", map_location="cpu", weights_only=False)["training_state"]
cuda_rng = isinstance(t.get("rng_cuda"), torch.Tensor)
once = steps == list(range(1, len(steps) + 1))
ok = rc1 == 75 and rc2 == 0 and saved > 0 and t["step"] == saved and t["loss_scale"] > 0 and cuda_rng and once
print(f"exit {rc1} then {rc2}; saved step {saved}, loss scale {t['loss_scale']:g}, CUDA generator state "
      f"{'saved' if cuda_rng else 'MISSING'}; steps 1..{len(steps)} each once: {once}: {'ok' if ok else 'FAILED'}")
PYEOF
)
  echo "$preempt"
  case "$preempt" in *ok) ;; *) FAIL=1 ;; esac
fi
if [ -x "$TRAIN" ]; then
  say "benchmark: aiacc_train resnet50, batch 256, AMP, channels-last, synthetic, $STEPS steps"
  "$TRAIN" --gpus 1 --data synthetic --arch resnet50 --batch-size 256 --image-size 224 \
    --synthetic-images $((256 * STEPS)) --epochs 1 --max-steps "$STEPS" --progress-seconds 5 \
    --report-file "$OUTDIR/aiacc_report.json" > "$OUTDIR/aiacc_train.log" 2>&1
  tail -22 "$OUTDIR/aiacc_train.log"
  aiacc_ips=$($PY -c "import json; print(round(json.load(open('$OUTDIR/aiacc_report.json'))['steady_images_per_s'], 1))" 2>/dev/null)
fi
say "benchmark: PyTorch eager resnet50 (torchvision), same settings"
$PY scripts/gpu/bench_eager.py --batch-size 256 --steps "$STEPS" 2>&1 | tee "$OUTDIR/eager.log" | tail -3
eager_ips=$(sed -n 's/.*steady \([0-9.]*\) images\/s.*/\1/p' "$OUTDIR/eager.log" | tail -1)

BENCH=$BUILD/app/aiacc_bench
if [ -x "$BENCH" ]; then
  DATA=/tmp/aiacc-photos
  [ -d "$DATA" ] || "$TRAIN" --make-sample "$DATA" --sample-classes 10 --sample-train-per-class 200 \
    --sample-val-per-class 1 --sample-min-side 375 --sample-max-side 500 > /dev/null
  say "data pipeline: 1 and $(nproc) threads at 224, uint8 batches (the GPU path)"
  one=$("$BENCH" data --data "$DATA" --image-size 224 --workers 1 --images 1500 --bytes | tee "$OUTDIR/data.log" \
        | sed -n 's/.* \([0-9.]*\) images\/s total.*/\1/p')
  all=$("$BENCH" data --data "$DATA" --image-size 224 --workers "$(nproc)" --images 12000 --repeat 6 --bytes | tee -a "$OUTDIR/data.log" \
        | sed -n 's/.* \([0-9.]*\) images\/s total.*/\1/p')
  data_ips=$all
  # End to end: the same JPEGs through aiacc_train's loader into ResNet-50 on the GPU (one
  # process, every core decoding), against the synthetic rate above.
  say "aiacc_train resnet50 on the JPEGs ($(nproc) decode workers), batch 256, 5 epochs"
  timeout 180 "$TRAIN" --gpus 1 --data "$DATA" --arch resnet50 --batch-size 256 --image-size 224 \
    --epochs 5 --workers "$(nproc)" --progress-seconds 5 \
    --report-file "$OUTDIR/jpeg_report.json" > "$OUTDIR/jpeg_train.log" 2>&1
  tail -4 "$OUTDIR/jpeg_train.log"
  jpeg_ips=$($PY -c "import json; print(round(json.load(open('$OUTDIR/jpeg_report.json'))['steady_images_per_s'], 1))" 2>/dev/null)
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "n/a" }'; }
{
  echo
  echo "==== GPU check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) ===="
  printf "%-52s %12s\n" "ResNet-50 bs256 AMP channels-last, images/s" ""
  printf "  %-50s %12s\n" "aiacc_train (steady, after warm-up)" "${aiacc_ips:-n/a}"
  printf "  %-50s %12s\n" "PyTorch eager (torchvision, autocast, GradScaler)" "${eager_ips:-n/a}"
  printf "  %-50s %12s\n" "ratio aiacc / eager (target >= 1.1x)" "$(ratio "${aiacc_ips:-0}" "${eager_ips:-0}")"
  printf "%-52s %12s\n" "data pipeline at 224 (uint8 batches), images/s" ""
  printf "  %-50s %12s\n" "1 thread" "${one:-n/a}"
  printf "  %-50s %12s\n" "$(nproc) threads" "${data_ips:-n/a}"
  printf "  %-50s %12s\n" "feeds the training rate? (threads / training)" "$(ratio "${data_ips:-0}" "${aiacc_ips:-0}")"
  printf "  %-50s %12s\n" "aiacc_train on the JPEGs, images/s" "${jpeg_ips:-n/a}"
  echo "preemption (SIGTERM, resume): ${preempt:-not run}"
  echo "GPU tests: $([ $FAIL = 0 ] && echo passed || echo FAILED, see $OUTDIR/tests.log)"
} | tee -a "$OUTDIR/summary.txt"
[ -n "${OUT:-}" ] && tar czf "$OUT/check-logs.tgz" -C "$OUTDIR" . && echo "logs: \$OUT/check-logs.tgz"
exit $FAIL
