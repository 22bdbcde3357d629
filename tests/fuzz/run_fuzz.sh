#!/usr/bin/env bash
# Builds the fuzzers and their seed writers with clang (only those targets, in build-fuzz/) and
# fuzzes each for SECONDS (default 60), side by side:
#   gguf_reader_fuzz   the GGUF reader; seeds from kiln-fuzz-seeds (tests/fuzz/fuzz_seeds.h) plus
#                      every saved regression in tests/fuzz/regressions/;
#   state_reader_fuzz  the saved-session-state reader; seeds from kiln-state-seeds plus
#                      tests/fuzz/state_regressions/.
# Exits non-zero when a fuzzer finds a crash, leak, timeout or sanitizer report; the crashing
# input is copied to the target's regressions folder as regression-<kind>-<sha1> (add it to git
# after fixing the bug: the corpus tests replay them).
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
cmake --build "$build_dir" --target gguf_reader_fuzz kiln-fuzz-seeds state_reader_fuzz \
  kiln-state-seeds -j"$(nproc)" >/dev/null

work="$(mktemp -d /tmp/kiln-fuzz-XXXXXX)"
trap 'rm -rf "$work"' EXIT

# fuzz TARGET SEED_WRITER REGRESSIONS_DIR MAX_LEN
fuzz() {
  local target=$1 seeds=$2 regressions=$3 max_len=$4
  local dir="$work/$target"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$regressions"
  "$build_dir/$seeds" "$dir/corpus" >/dev/null
  cp "$regressions"/* "$dir/corpus/" 2>/dev/null || true
  set +e
  "$build_dir/$target" "$dir/corpus" -max_len="$max_len" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
    >"$dir/log" 2>&1
  local rc=$?
  set -e
  local runs cov found
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+' "$dir/log" | tail -1 | grep -oE '[0-9]+' || echo "?")
  found=$(ls "$dir/artifacts" | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    tail -60 "$dir/log"
    # Renamed: crash-*/leak-*/timeout-* are ignored by the repository .gitignore.
    for a in "$dir/artifacts/"*; do
      [ -e "$a" ] && cp "$a" "$regressions/regression-$(basename "$a")"
    done
    echo "fuzz: $target FAILED after ${seconds}s: rc=$rc, $found crashing input(s) copied to $regressions/"
    return 1
  fi
  echo "fuzz: $target ok: ${seconds}s, $runs runs, coverage $cov edges, corpus $(ls "$dir/corpus" | wc -l) files, 0 crashes"
}

# Both at once (one core each): the stage takes SECONDS, not twice that.
fuzz gguf_reader_fuzz kiln-fuzz-seeds tests/fuzz/regressions 65536 &
gguf_pid=$!
fuzz state_reader_fuzz kiln-state-seeds tests/fuzz/state_regressions 65536 &
state_pid=$!
status=0
wait "$gguf_pid" || status=1
wait "$state_pid" || status=1
exit $status
