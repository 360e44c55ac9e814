#!/usr/bin/env bash
# README.md shows examples/ddp_minimal's change from one process to N as a diff: the block after
# the "ddp_minimal diff" marker must be exactly what diff prints for the two files today, so the
# code README shows is the code CI compiles and runs (tests/install_test.sh), and it may add at
# most 6 essential lines to the one-process program. After editing the
# example: tests/readme_diff_test.sh . --update
# Usage: readme_diff_test.sh SOURCE_DIR [--update]   (--update: rewrite README.md's block from the files)
set -euo pipefail
src=${1:?usage: $0 SOURCE_DIR [--update]}
cd "$src"
if [ "${2:-}" = --update ]; then
  diff -u --label train.cc --label train_ddp.cc examples/ddp_minimal/train.cc examples/ddp_minimal/train_ddp.cc > README.diff.tmp || true
  awk -v diff=README.diff.tmp '/<!-- ddp_minimal diff:/ {print; marker = 1; next}
       marker && /^```diff$/ {print; while ((getline line < diff) > 0) print line; skip = 1; marker = 0; next}
       skip && /^```$/ {skip = 0} !skip {print}' README.md > README.md.tmp
  mv README.md.tmp README.md
  rm README.diff.tmp
fi
shown=$(awk '/<!-- ddp_minimal diff:/ {marker = 1; next} marker && /^```diff$/ {inside = 1; next}
             inside && /^```$/ {exit} inside {print}' README.md)
[ -n "$shown" ] || { echo "readme_diff_test: FAIL: README.md has no diff block after the ddp_minimal marker" >&2; exit 1; }
actual=$(diff -u --label train.cc --label train_ddp.cc examples/ddp_minimal/train.cc examples/ddp_minimal/train_ddp.cc || true)
if [ "$shown" != "$actual" ]; then
  echo "readme_diff_test: FAIL: README.md's diff differs from the example's files; the difference:" >&2
  diff <(echo "$shown") <(echo "$actual") >&2 || true
  exit 1
fi
# What a user adds to a one-process program: the added lines of the diff (a changed line counts
# once), blank and comment-only lines aside. PyTorch DDP's tutorial needs 6; so may aiacc.
essential=$(echo "$actual" | grep '^+[^+]' | grep -v '^+[[:space:]]*$' | grep -vc '^+[[:space:]]*//' || true)
[ "$essential" -le 6 ] || { echo "readme_diff_test: FAIL: the example adds $essential essential lines (at most 6)" >&2; exit 1; }
echo "readme_diff_test: README.md shows the example's diff: $essential essential lines added"
