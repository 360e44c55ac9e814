#!/usr/bin/env bash
# Checks C++ files against .clang-format (clang-format 14, installed by scripts/setup.sh) without
# changing them: one line per file that is not formatted, with the command that fixes it.
#   scripts/format_check.sh              every tracked *.h / *.cc under app comm data models common tests
#   scripts/format_check.sh FILE...      those files
# Exit status: 0 all formatted, 1 some are not, 2 clang-format missing or a file unreadable.
# CLANG_FORMAT overrides the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "format_check.sh: $CLANG_FORMAT not found: run scripts/setup.sh (Debian package clang-format)" >&2
  exit 2
fi

files=()
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- 'app/*.h' 'app/*.cc' 'comm/*.h' 'comm/*.cc' 'data/*.h' 'data/*.cc' \
                                       'models/*.h' 'models/*.cc' 'common/*.h' 'common/*.cc' 'tests/*.h' 'tests/*.cc')
fi

bad=0
for f in "${files[@]}"; do
  if [ ! -r "$f" ]; then
    echo "format_check.sh: cannot read $f" >&2
    exit 2
  fi
  if ! "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "$f: not clang-formatted; fix: $CLANG_FORMAT -i $f"
    bad=$((bad + 1))
  fi
done
if [ "$bad" -gt 0 ]; then
  echo "format_check.sh: $bad of ${#files[@]} files need formatting" >&2
  exit 1
fi
echo "format_check.sh: ${#files[@]} files formatted"
