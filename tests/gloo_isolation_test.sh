#!/usr/bin/env bash
# One Gloo per process: every library that aiacc_train loads is listed; only the owner's may
# define Gloo's symbols, and every Gloo symbol bound at start-up (LD_BIND_NOW, so all of them)
# binds to the owner. (A pip wheel links the same Gloo build into both libtorch_cpu and
# libtorch_cuda, 28 functions of it in each: PyTorch's own linking, one source, not a second Gloo.)
#   gloo_isolation_test.sh BINARY OWNER USES
#     OWNER: the library (an extended regex of file names) that must own Gloo: libgloo\.so
#            (Debian's LibTorch and aiacc share the system Gloo) or libtorch_(cpu|cuda)\.so (a
#            LibTorch with Gloo inside, e.g. a pip wheel: its CPU and CUDA halves, one build)
#     USES:  yes when aiacc's own code calls Gloo (GlooTransport built), no when it must not
set -euo pipefail
bin=$1 owner=$2 uses=$3
fail() { echo "gloo_isolation: FAIL: $*" >&2; exit 1; }

libs=$(ldd "$bin" | awk '/=>/ && $3 ~ /^\// {print $3}')
[ -n "$libs" ] || fail "ldd listed no libraries for $bin"
definers=()
for lib in $libs; do
  n=$(nm -D --defined-only "$lib" 2>/dev/null | grep -c ' _ZN4gloo' || true)
  [ "$n" -gt 0 ] || continue
  definers+=("$(basename "$lib"):$n")
  printf '%s\n' "$(basename "$lib")" | grep -qE "^($owner)" || fail "Gloo is defined by $(basename "$lib"), expected only $owner"
done
echo "libraries defining gloo:: symbols: ${definers[*]:-none}"
[ ${#definers[@]} -ge 1 ] || fail "no library defines Gloo"

imports=$(nm -D --undefined-only "$bin" | grep -c ' _ZN4gloo' || true)
echo "gloo:: symbols aiacc_train imports: $imports"
if [ "$uses" = no ] && [ "$imports" -gt 0 ]; then fail "aiacc_train calls Gloo although it was built without GlooTransport"; fi
if [ "$uses" = yes ] && [ "$imports" -eq 0 ]; then fail "aiacc_train imports no Gloo symbol although GlooTransport is built"; fi

# Every binding of a gloo symbol, from any object, at start-up.
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$log/ld" "$bin" --help > /dev/null 2>&1 || true
bound=$(cat "$log"/ld.* | grep "normal symbol \`_ZN4gloo" || true)
total=$(printf '%s' "$bound" | grep -c . || true)
wrong=$(printf '%s\n' "$bound" | grep -v -E "to [^ ]*/($owner)[^ ]* \[" | grep -c . || true)
echo "gloo:: bindings at start-up: $total, to another library than $owner: $wrong"
if [ "$wrong" -gt 0 ]; then
  printf '%s\n' "$bound" | grep -v -E "to [^ ]*/($owner)[^ ]* \[" | head -5 >&2
  fail "gloo symbols bound to a second copy"
fi
if [ "$uses" = yes ] && [ "$total" -eq 0 ]; then fail "no gloo binding seen (LD_DEBUG output empty?)"; fi
echo "gloo_isolation: one Gloo ($owner)"
