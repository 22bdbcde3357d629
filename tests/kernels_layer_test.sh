#!/usr/bin/env bash
# kernels/ is a layer below lib/, and its SIMD code runs only on CPUs that have the instruction set:
#  1. kernels/ files include only kernels/ headers and lib/common (and system headers);
#  2. kiln_kernels_cpu calls nothing of kiln's outside itself (every undefined kiln:: symbol of
#     the archive is defined by one of its members);
#  3. the SIMD members (*_avx2.cc.o, *_avx512.cc.o) define no weak or unique symbol: the linker
#     keeps one copy of such a function (an inline function, a template instance) for the whole
#     program, and a copy compiled for AVX-512 would then run on CPUs without it;
#  4. no member has a static initializer (.init_array): nothing of the kernels runs at load time,
#     before the CPU's level is known.
# Usage: kernels_layer_test.sh SOURCE_DIR LIBKILN_KERNELS_CPU.a [--no-object-checks]
# (--no-object-checks skips 3 and 4 in sanitizer builds, whose instrumentation adds both.)
set -euo pipefail
src="$1"
archive="$2"
object_checks=1
[[ "${3:-}" == --no-object-checks ]] && object_checks=0
fail=0

bad_includes=$(grep -rnE '^\s*#\s*include\s+"' "$src/kernels" --include='*.h' --include='*.cc' \
  --include='*.cu' | grep -vE '#\s*include\s+"(kernels/|lib/common/)' || true)
if [[ -n "$bad_includes" ]]; then
  echo "kernels/ includes headers outside kernels/ and lib/common:" >&2
  echo "$bad_includes" >&2
  fail=1
fi

defined=$(nm -C --defined-only "$archive" 2>/dev/null | awk 'NF >= 3 { $1 = ""; $2 = ""; print substr($0, 3) }' | sort -u)
undefined=$(nm -C --undefined-only "$archive" 2>/dev/null | awk '$1 == "U" { $1 = ""; print substr($0, 2) }' | sort -u)
outside=$(comm -23 <(echo "$undefined" | grep '^kiln::' || true) <(echo "$defined"))
if [[ -n "$outside" ]]; then
  echo "kiln_kernels_cpu calls kiln code outside itself:" >&2
  echo "$outside" >&2
  fail=1
fi

if [[ $object_checks == 1 ]]; then
  shared=$(nm -A -C --defined-only "$archive" | grep -E '_avx(2|512)\.cc\.o:' |
    awk '$2 ~ /^[WVu]$/' || true)
  if [[ -n "$shared" ]]; then
    echo "SIMD kernel objects define symbols the linker may share with other code:" >&2
    echo "$shared" >&2
    fail=1
  fi
  initializers=$(objdump -h "$archive" | awk '/file format/ { member = $1 } /\.init_array|\.ctors/ { print member }')
  if [[ -n "$initializers" ]]; then
    echo "kernel objects with static initializers:" >&2
    echo "$initializers" >&2
    fail=1
  fi
fi
members=$(ar t "$archive" | wc -l)
[[ $members -ge 10 ]] || { echo "only $members members in $archive" >&2; fail=1; }
[[ $fail == 0 ]] && echo "kernels_layer_test: $members objects, includes and symbols in bounds"
exit $fail
