#!/usr/bin/env bash
# What an application must ship next to libkiln.so, and what libkiln.so shows it:
# - NEEDED: with static dependencies (KILN_STATIC_DEPS) only the C runtime (libc, libm, the
#   dynamic loader; libgcc_s tolerated); without, also libstdc++ and the Abseil and Protobuf-lite
#   shared libraries. Never anything else: the CUDA backend is loaded at run time, not linked.
# - Exported symbols: only kiln_* (visibility and the version script), whichever way the
#   dependencies are linked: a static Abseil, Protobuf or libstdc++ must stay hidden inside.
#
# Usage: needed_test.sh LIBKILN STATIC(ON|OFF)
set -euo pipefail
lib=$1
static=$2

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

command -v readelf >/dev/null || fail "readelf (binutils) is not installed"
[[ -f $lib ]] || fail "no library at $lib"

mapfile -t needed < <(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
((${#needed[@]} > 0)) || fail "$lib has no NEEDED entries at all (is it a shared library?)"
echo "NEEDED (static dependencies $static): ${needed[*]}"

runtime='^(libc\.so\.6|libm\.so\.6|ld-linux-[a-z0-9_-]+\.so\.[0-9]+|libgcc_s\.so\.1)$'
dynamic_deps='^(libstdc\+\+\.so\.6|libabsl_[a-z0-9_]+\.so\.[0-9.]+|libprotobuf-lite\.so\.[0-9.]+)$'
for entry in "${needed[@]}"; do
  if [[ $entry =~ $runtime ]]; then
    continue
  fi
  if [[ $static == OFF && $entry =~ $dynamic_deps ]]; then
    continue
  fi
  fail "libkiln.so needs $entry (static dependencies $static)"
done
if [[ $static == ON ]]; then
  printf '%s\n' "${needed[@]}" | grep -q '^libc\.so\.6$' || fail "libc.so.6 is not NEEDED: not a dynamic library?"
fi

# Defined dynamic symbols other than kiln_* (the version node's own name is an ABS symbol).
others=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | grep -v '^kiln_' || true)
[[ -z $others ]] || fail "libkiln.so exports symbols besides kiln_*: $(echo "$others" | head -5 | tr '\n' ' ')"
echo "exports: $(nm -D --defined-only "$lib" | grep -c ' T kiln_') kiln_* functions, nothing else"
echo "PASS"
