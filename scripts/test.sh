#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: install, build (warnings are errors), fetch the
# default model and Gemma 3 270M, run ctest, then the language bindings' tests (Python, Rust, Go,
# C#); the release build's programs as other CPUs (qemu) and under valgrind; the Windows build
# (mingw-w64: kiln.dll, the C API tests and kiln.exe under wine; see below for when); then again
# under ASan+UBSan (the real-model tests in their quick mode: QuickMode in tests/common/test_util.h); the
# concurrency tests under ThreadSanitizer; then a short libFuzzer run. Set KILN_SKIP_BINDINGS=1,
# KILN_SKIP_PORTABILITY=1, KILN_SKIP_WINDOWS=1, KILN_SKIP_SANITIZE=1, KILN_SKIP_TSAN=1 or
# KILN_SKIP_FUZZ=1 to skip a stage while iterating locally. The sanitizer stages run the stress test
# (c_stress_test) for KILN_STRESS_SECONDS (default 30) instead of the release stage's 5.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_model.sh >/dev/null
scripts/fetch_gemma3.sh >/dev/null
jobs=$(nproc)
stress_seconds="${KILN_STRESS_SECONDS:-30}"
# Each stage's wall time, printed as it ends and once more at the end (CI's budget is per suite).
stage_start=$SECONDS
stage_name=""
stage() {
  [[ -n "$stage_name" ]] && echo "== $stage_name: $((SECONDS - stage_start)) s"
  stage_name="$1"
  stage_start=$SECONDS
  [[ -n "$stage_name" ]] && echo "== $stage_name"
  return 0
}

stage "release build + ctest"
scripts/build.sh build
(cd build && ctest -j"$jobs" --output-on-failure)

if [ "${KILN_SKIP_BINDINGS:-0}" != 1 ]; then
  # Not in ctest: the sanitizer stages would run them again, and they test libkiln's C API,
  # which c_api_test already covers under ASan.
  stage "language bindings (Python, Rust, Go, C#) against the release build"
  scripts/test_bindings.sh build
fi

if [ "${KILN_SKIP_PORTABILITY:-0}" != 1 ]; then
  stage "other CPUs (qemu-x86_64: Haswell, Nehalem) and valgrind memcheck"
  scripts/test_cpu_portability.sh build
fi

# The Windows stage: its cross-built dependencies and ccache's objects are kept in ~/.cache/kiln,
# but it fits the suite's budget without them too: from nothing, on two idle cores, 282 s
# (dependencies 97 s, kiln's cross build 158 s, tests under wine 16 s). KILN_SKIP_WINDOWS=1 skips it.
if [ "${KILN_SKIP_WINDOWS:-0}" != 1 ]; then
  stage "Windows (mingw-w64 cross build, C API tests and kiln.exe under wine)"
  scripts/test_windows.sh build
fi

if [ "${KILN_SKIP_SANITIZE:-0}" != 1 ]; then
  stage "ASan+UBSan build + ctest"
  # The benchmarks are not built: nothing runs them here. The test sources get ASan only
  # (tests/CMakeLists.txt): UBSan checks what they run.
  scripts/build.sh build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON -DKILN_CUDA=OFF \
    -DKILN_BUILD_BENCH=OFF
  (cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     KILN_STRESS_SECONDS="$stress_seconds" ctest -j"$jobs" --output-on-failure)
fi

if [ "${KILN_SKIP_TSAN:-0}" != 1 ]; then
  # Only the tests of concurrent sessions, on tiny models (scheduler_test's default-model case
  # alone takes minutes here): ThreadSanitizer slows everything 5-15x, and the rest of the suite
  # runs single-threaded code the ASan stage already covers. About 7 minutes on 2 cores, the build
  # two thirds of it.
  stage "ThreadSanitizer build + concurrency tests"
  tsan_tests=(c_stress_test c_scheduler_test scheduler_test)
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON -DKILN_TSAN=ON \
    -DKILN_CUDA=OFF >/dev/null
  cmake --build build-tsan -j"$jobs" --target "${tsan_tests[@]}" kiln-mkmodel
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
     KILN_STRESS_SECONDS="$stress_seconds" GTEST_FILTER='TinyScheduler.*' \
     ctest -j"$jobs" --output-on-failure -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$")
fi

if [ "${KILN_SKIP_FUZZ:-0}" != 1 ] && [ -f tests/fuzz/run_fuzz.sh ]; then
  stage "fuzz"
  tests/fuzz/run_fuzz.sh "${KILN_FUZZ_SECONDS:-60}"
fi
stage ""
echo "== all test stages passed in ${SECONDS} s (installs and fetches included)"
