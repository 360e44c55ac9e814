#!/usr/bin/env bash
# The main job: set up if needed, build, generate the sample dataset if missing, train to the
# target and print the report. Without --data, trains on the generated sample with the CPU
# recipe (recipes/cpu_sample.recipe); any other arguments go to aiacc_train, e.g.
#   scripts/run.sh --data /imagenet --recipe recipes/dawnbench_8gpu.recipe
set -euo pipefail
cd "$(dirname "$0")/.."
AIACC_SKIP_TORCH2=1 scripts/setup.sh  # the main job uses the Debian build only (no 2.x venv)
scripts/build.sh
BIN=${AIACC_BUILD_DIR:-build}/app/aiacc_train
has_data=0
for a in "$@"; do
  case "$a" in --data|--data=*) has_data=1 ;; esac
done
if [ "$has_data" = 1 ]; then
  exec "$BIN" "$@"
fi
SAMPLE=${AIACC_SAMPLE_DIR:-sample_data}
if [ ! -d "$SAMPLE" ]; then
  "$BIN" --make-sample "$SAMPLE"
fi
mkdir -p runs
exec "$BIN" --data "$SAMPLE" --recipe recipes/cpu_sample.recipe \
  --report-file runs/sample_report.json --metrics-file runs/sample_metrics.jsonl "$@"
