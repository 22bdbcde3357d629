#!/usr/bin/env bash
# The Windows build: kiln cross-built with mingw-w64 (cmake/mingw-w64-x86_64.cmake) into kiln.dll
# and its import library libkiln.dll.a, its exports checked against kiln.map, and the C API test
# programs, platform_test and kiln_cli_test (kiln.exe and kiln-mkmodel.exe) run under wine on the
# default model. The greedy logits under wine must be bitwise those of the native build (the same
# kernels run). The thread tests (c_thread_exit_test: threads that end after using kiln;
# c_stress_test) run on a tiny model written by the native kiln-mkmodel. A program that crashes
# under wine can still exit with status 0 (a thread's crash while the main thread exits), so every
# program's output is also searched for wine's "Unhandled exception" report. The Python binding's
# Windows lookup must find the DLL built here.
#
# Usage: scripts/test_windows.sh [NATIVE_BUILD_DIR [WINDOWS_BUILD_DIR]]   (defaults build,
#        build-windows). NATIVE_BUILD_DIR: a release build with kiln_logits_dump, kiln and
#        kiln-mkmodel built.
# Abseil, Protobuf lite and GoogleTest are cross-built once into ~/.cache/kiln
# (scripts/build_mingw_deps.sh); wine's prefix lives there too (KILN_WINEPREFIX), and ccache's
# objects (KILN_MINGW_CCACHE, default ~/.cache/kiln/ccache-mingw).
# Measured on a fresh clone, two idle cores, nothing cached (dependencies, ccache's objects, wine's
# prefix): 282 s (dependencies 97 s, cross build 158 s with 109 compilations, tests under wine 16
# s). The earlier figures of 20-45 minutes were measured at a load average of 15-21.
set -euo pipefail
cd "$(dirname "$0")/.."
native=${1:-build}
out=${2:-build-windows}
jobs=$(nproc)
model="${KILN_MODEL_DIR:-$HOME/.cache/kiln}/SmolLM2-135M-Instruct.Q4_1.gguf"

# ccache (when installed) keeps the cross-compiled objects in ~/.cache/kiln too, so a clean clone
# recompiles only what changed since the last run on this machine. Its base directory is the
# repository, so that clones in other folders share the objects.
if command -v ccache >/dev/null; then
  export CCACHE_DIR=${KILN_MINGW_CCACHE:-$HOME/.cache/kiln/ccache-mingw} CCACHE_BASEDIR=$PWD
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-2G}
  # Without precompiled headers: ccache does not cache a compilation that reads one.
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DKILN_PCH=OFF)
  ccache --zero-stats >/dev/null
else
  launcher=()
fi

start=$SECONDS
prefix=$(scripts/build_mingw_deps.sh)
echo "test_windows: dependencies ($prefix) in $((SECONDS - start)) s"

# Everything the prefix has is a static archive, and the toolchain links the C++ runtime
# statically: kiln.dll needs only Windows' own DLLs and libwinpthread-1.dll whatever
# KILN_STATIC_DEPS says (its probe is for ELF shared objects). Programs and kiln.dll share one folder, as an application ships.
start=$SECONDS
# A build dir configured with another prefix (other dependencies) would keep their cached paths.
if [[ "$(cat "$out/deps-prefix.txt" 2>/dev/null)" != "$prefix" ]]; then
  rm -rf "$out/CMakeCache.txt" "$out/CMakeFiles"
fi
cmake -S . -B "$out" -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON -DKILN_CUDA=OFF \
  -DKILN_STATIC_DEPS=OFF -DKILN_BUILD_SAMPLES=OFF -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$PWD/$out/bin" \
  -DProtobuf_LIBRARY="$prefix/lib/libprotobuf-lite.a" -DProtobuf_INCLUDE_DIR="$prefix/include" \
  "${launcher[@]}" >/dev/null
echo "$prefix" >"$out/deps-prefix.txt"
tests=(c_api_test c_session_test c_scheduler_test c_abi_test platform_test kiln_cli_test)
thread_tests=(c_thread_exit_test c_stress_test)
# kiln_cli_test runs kiln.exe and kiln-mkmodel.exe (the targets kiln_cli and kiln-mkmodel).
cmake --build "$out" -j"$jobs" --target kiln kiln_cli kiln-mkmodel kiln_logits_dump \
  c_api_test c_session_test c_scheduler_test c_abi_test platform_test "${thread_tests[@]}"
# The one mingw DLL kiln.dll needs (see the toolchain file), shipped beside it.
cp /usr/x86_64-w64-mingw32/lib/libwinpthread-1.dll "$out/bin/"
echo "test_windows: cross build in $((SECONDS - start)) s"
if [[ ${#launcher[@]} -gt 0 ]]; then
  echo "test_windows: ccache: $(ccache --print-stats | awk -F'\t' '$1 ~ /^(direct|preprocessed)_cache_hit$|^cache_miss$/ {printf "%s %s ", $1, $2}')"
fi

# kiln.dll exports exactly the C API: every kiln_* function of the native libkiln.so, nothing else.
dll=$out/bin/kiln.dll
[[ -f $dll && -f $out/lib/c_api/libkiln.dll.a ]] || { echo "no kiln.dll or libkiln.dll.a" >&2; exit 1; }
x86_64-w64-mingw32-objdump -p "$dll" |
  awk '/^\[Ordinal\/Name Pointer\] Table/ {on = 1; next} on && NF == 0 {on = 0} on {print $NF}' |
  sort >"$out/dll_exports.txt"
native_lib=$(ls "$native"/lib/c_api/libkiln.so.[0-9]* | head -1)
nm -D --defined-only "$native_lib" | awk '$2 == "T" {print $3}' | sort >"$out/so_exports.txt"
if ! diff "$out/so_exports.txt" "$out/dll_exports.txt"; then
  echo "test_windows: kiln.dll's exports differ from libkiln.so's (< so, > dll)" >&2
  exit 1
fi
echo "test_windows: kiln.dll exports the $(wc -l <"$out/dll_exports.txt") functions libkiln.so does"

# The Python binding's lookup on Windows (no Windows Python here to run it): from this checkout its
# first candidate must be the DLL just built (build-windows/bin, the default WINDOWS_BUILD_DIR).
if [[ $(realpath "$out") == "$PWD/build-windows" ]]; then
  first=$(python3 -c 'import importlib.util as u, sys
spec = u.spec_from_file_location("libpath", "bindings/python/kiln/_libpath.py")
libpath = u.module_from_spec(spec); spec.loader.exec_module(libpath)
print(libpath.candidates("win32", {})[0])')
  [[ $(realpath "$first") == $(realpath "$dll") ]] ||
    { echo "test_windows: the Python binding looks for kiln.dll at $first, not $dll" >&2; exit 1; }
  echo "test_windows: the Python binding finds $first"
fi

# wine passes the environment on except HOME: the tests find the model through KILN_MODEL_DIR.
export WINEPREFIX=${KILN_WINEPREFIX:-$HOME/.cache/kiln/wine-prefix} WINEARCH=win64 WINEDEBUG=-all
export KILN_MODEL_DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln}"
[[ -d $WINEPREFIX ]] || wineboot --init >/dev/null 2>&1

# Fails if a program's output (FILE) has wine's report of an unhandled exception.
no_crash_report() {
  if grep -q "Unhandled exception" "$1"; then
    echo "test_windows: a program crashed under wine (its exit status may not say so):" >&2
    grep -B2 -A30 -m1 "Unhandled exception" "$1" >&2
    exit 1
  fi
}

start=$SECONDS
(cd "$out" && ctest -j"$jobs" --output-on-failure --output-log wine-tests.log \
   -R "^($(IFS='|'; echo "${tests[*]}"))\$")
no_crash_report "$out/wine-tests.log"
"$native/tools/kiln-mkmodel/kiln-mkmodel" --shape tiny-llama-gqa --type q8_0 --seed 23 \
  --out "$out/tiny.gguf" >/dev/null
# 256 threads that end after tokenizing, failing a call and generating on a pool of their own.
wine "$out/bin/c_thread_exit_test.exe" "$out/tiny.gguf" 64 >"$out/thread_exit.log" 2>&1 ||
  { cat "$out/thread_exit.log" >&2; exit 1; }
no_crash_report "$out/thread_exit.log"
grep -q "ended, 0 failures" "$out/thread_exit.log" || { cat "$out/thread_exit.log" >&2; exit 1; }
wine "$out/bin/c_stress_test.exe" "$out/tiny.gguf" 5 >"$out/stress.log" 2>&1 ||
  { cat "$out/stress.log" >&2; exit 1; }
no_crash_report "$out/stress.log"
grep -q "c_stress_test: ok" "$out/stress.log" || { cat "$out/stress.log" >&2; exit 1; }
echo "test_windows: tests under wine in $((SECONDS - start)) s"

# Greedy decoding: the same logits, bit for bit, and the same text as the native build.
start=$SECONDS
prompt="What is the capital of France? Answer in one sentence."
wine "$out/bin/kiln_logits_dump.exe" "$model" "$prompt" 6 2>"$out/logits.wine.err" |
  tr -d '\r' >"$out/logits.wine"
no_crash_report "$out/logits.wine.err"
"$native/tests/c_api/kiln_logits_dump" "$model" "$prompt" 6 2>/dev/null >"$out/logits.native"
[[ $(wc -l <"$out/logits.native") == 7 ]] || { echo "kiln_logits_dump printed no steps" >&2; exit 1; }
diff "$out/logits.native" "$out/logits.wine" ||
  { echo "test_windows: logits under wine differ from the native build's" >&2; exit 1; }
echo "test_windows: greedy logits under wine equal the native build's ($((SECONDS - start)) s)"
