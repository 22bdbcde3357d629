#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: install, build (warnings are errors), fetch
# the default model and Gemma 3 270M, run ctest; then again under ASan+UBSan; then a short
# libFuzzer run.
# Set KILN_SKIP_SANITIZE=1 or KILN_SKIP_FUZZ=1 to skip a stage while iterating locally.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_model.sh >/dev/null
scripts/fetch_gemma3.sh >/dev/null
jobs=$(nproc)

echo "== release build + ctest"
scripts/build.sh build
(cd build && ctest -j"$jobs" --output-on-failure)

if [ "${KILN_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== ASan+UBSan build + ctest"
  scripts/build.sh build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON -DKILN_CUDA=OFF
  (cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest -j"$jobs" --output-on-failure)
fi

if [ "${KILN_SKIP_FUZZ:-0}" != 1 ] && [ -f tests/fuzz/run_fuzz.sh ]; then
  echo "== fuzz"
  tests/fuzz/run_fuzz.sh "${KILN_FUZZ_SECONDS:-60}"
fi
echo "== all test stages passed"
