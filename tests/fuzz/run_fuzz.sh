#!/usr/bin/env bash
# Builds the GGUF reader fuzzer and the seed writer kiln-fuzz-seeds with clang (only those two
# targets, in build-fuzz/), writes the seed corpus (tests/fuzz/fuzz_seeds.h) plus every saved
# regression into a temporary directory and fuzzes it for SECONDS (default 60). Exits non-zero
# when the fuzzer finds a crash, leak, timeout or sanitizer report; the crashing input is copied to
# tests/fuzz/regressions/regression-<kind>-<sha1> (add it to git after fixing the bug: the corpus gtest replays it).
# Usage: tests/fuzz/run_fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
build_dir="${KILN_FUZZ_BUILD_DIR:-build-fuzz}"

# Standalone configure of tests/fuzz only (see its CMakeLists.txt): quick, and unaffected by the
# rest of the tree.
mkdir -p "$build_dir"
CC=clang CXX=clang++ cmake -S tests/fuzz -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKILN_WERROR=ON >"$build_dir/configure.log" 2>&1 || {
  cat "$build_dir/configure.log"; exit 1; }
cmake --build "$build_dir" --target gguf_reader_fuzz kiln-fuzz-seeds -j"$(nproc)" >/dev/null

work="$(mktemp -d /tmp/kiln-fuzz-XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
"$build_dir/kiln-fuzz-seeds" "$work/corpus" >/dev/null
cp tests/fuzz/regressions/* "$work/corpus/" 2>/dev/null || true

set +e
"$build_dir/gguf_reader_fuzz" "$work/corpus" -max_len=65536 -max_total_time="$seconds" \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
  >"$work/log" 2>&1
rc=$?
set -e
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$' || echo "?")
cov=$(grep -oE 'cov: [0-9]+' "$work/log" | tail -1 | grep -oE '[0-9]+' || echo "?")
found=$(ls "$work/artifacts" | wc -l)
if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
  tail -60 "$work/log"
  # Renamed: crash-*/leak-*/timeout-* are ignored by the repository .gitignore.
  for a in "$work/artifacts/"*; do
    [ -e "$a" ] && cp "$a" "tests/fuzz/regressions/regression-$(basename "$a")"
  done
  echo "fuzz: gguf_reader_fuzz FAILED after ${seconds}s: rc=$rc, $found crashing input(s) copied to tests/fuzz/regressions/"
  exit 1
fi
echo "fuzz: gguf_reader_fuzz ok: ${seconds}s, $runs runs, coverage $cov edges, corpus $(ls "$work/corpus" | wc -l) files, 0 crashes"
