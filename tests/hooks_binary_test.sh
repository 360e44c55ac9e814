#!/usr/bin/env bash
# Test faults and benchmark switches stay out of the production binary (app/binary_hooks.h):
# aiacc_train links no parser of the AIACC_TEST_* / AIACC_BENCH_* variables, and a fault set in
# its environment does nothing, while aiacc_train_hooked reads it.
# Usage: hooks_binary_test.sh AIACC_TRAIN AIACC_TRAIN_HOOKED WORK_DIR
set -euo pipefail
train=$1 hooked=$2 work=$3
fail() { echo "hooks_binary_test: FAIL: $*" >&2; exit 1; }
parser=testHooksFromEnvironment
# (grep over a file: grep -q would end the pipe early, and pipefail count nm's SIGPIPE)
rm -rf "$work" && mkdir -p "$work"
nm -C "$train" > "$work/train.nm" && nm -C "$hooked" > "$work/hooked.nm"
grep -q "$parser" "$work/train.nm" && fail "$train links $parser"
grep -q "$parser" "$work/hooked.nm" || fail "$hooked does not link $parser"
# A malformed fault: the hooked build refuses it before training, aiacc_train trains one step.
job=(--data synthetic --arch resnet18-w16 --synthetic-classes 2 --synthetic-images 16 --batch-size 8 --image-size 32
     --epochs 1 --max-steps 1 --warmup-epochs 0 --threads 1 --noautotune --eval-every 0)
if AIACC_TEST_FAIL_AT_STEP=bogus "$hooked" "${job[@]}" > "$work/hooked.log" 2>&1; then
  cat "$work/hooked.log"; fail "aiacc_train_hooked accepted AIACC_TEST_FAIL_AT_STEP=bogus"
fi
grep -q "AIACC_TEST_FAIL_AT_STEP must be RANK:STEP (got 'bogus')" "$work/hooked.log" ||
  { cat "$work/hooked.log"; fail "aiacc_train_hooked's refusal does not name the variable"; }
AIACC_TEST_FAIL_AT_STEP=bogus "$train" "${job[@]}" > "$work/train.log" 2>&1 ||
  { cat "$work/train.log"; fail "aiacc_train read AIACC_TEST_FAIL_AT_STEP"; }
echo "hooks_binary_test: passed"
