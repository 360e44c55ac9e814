#!/usr/bin/env bash
# Every binding of a symbol family at start-up (LD_BIND_NOW: all of them) goes to one library.
#   symbol_binding_test.sh BINARY MANGLED_PREFIX OWNER [ARGS...]
# e.g. _ZNSt10filesystem libstdc++.so: std::filesystem must come from the system libstdc++, not
# from the copies a pip LibTorch exports (pytorch/pytorch#133437), which crash when called.
# ARGS: what to run the binary with (default --help); it only has to start.
# Bindings made inside LibTorch's own libraries are not checked.
set -euo pipefail
bin=$1 prefix=$2 owner=$3
shift 3
[ $# -gt 0 ] || set -- --help
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$log/ld" "$bin" "$@" > /dev/null 2>&1 || true
# Bindings from LibTorch's own libraries to themselves are theirs to make (inline functions they
# emitted); every other object (the binary, the system's libraries) must get the owner's.
bound=$(cat "$log"/ld.* | grep "normal symbol \`$prefix" | grep -v -E "binding file [^ ]*/lib(torch|c10)[^/ ]*\.so" || true)
total=$(printf '%s' "$bound" | grep -c . || true)
wrong=$(printf '%s\n' "$bound" | grep -v "to [^ ]*/$owner[^ ]* \[" | grep -c . || true)
echo "$(basename "$bin"): $total bindings of $prefix*, $wrong to another library than $owner"
if [ "$total" -eq 0 ]; then echo "symbol_binding: FAIL: no binding of $prefix* seen" >&2; exit 1; fi
if [ "$wrong" -gt 0 ]; then
  printf '%s\n' "$bound" | grep -v "to [^ ]*/$owner[^ ]* \[" | head -5 >&2
  echo "symbol_binding: FAIL: $prefix* bound outside $owner" >&2
  exit 1
fi
