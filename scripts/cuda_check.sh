#!/usr/bin/env bash
# Everything CUDA in one call, for a machine with an NVIDIA device (e.g. a lent H200), in under 8
# minutes: configure with KILN_CUDA=ON (warnings as errors), build the module and the device tests
# and benchmarks, run every device test (each device op against the CPU backend) and the device
# benchmarks, then print a summary. Exits non-zero on any failure, and at once (exit 3, before
# building) when no device is visible, so a run on the wrong machine cannot pass by skipping.
#   scripts/cuda_check.sh              # sm_90 only (KILN_CUDA_ARCHS to change; the test command
#                                      # itself builds sm_80 and sm_90)
#   KILN_CUDA_CHECK_ALLOW_NO_DEVICE=1  # build and run anyway (the device tests then skip)
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
dir="${KILN_CUDA_BUILD_DIR:-build-cuda}"
archs="${KILN_CUDA_ARCHS:-90}"
summary=()
failed=0
note() { summary+=("$1"); echo "== $1"; }

echo "== devices"
have_device=1
if ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  have_device=0
  echo "cuda_check: no NVIDIA device visible (nvidia-smi -L lists none or is missing)." >&2
  if [ "${KILN_CUDA_CHECK_ALLOW_NO_DEVICE:-0}" != 1 ]; then
    echo "cuda_check: FAILED: this check needs a GPU; nothing was run." >&2
    exit 3
  fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

# The tools and tests are needed (the tests use kiln-mkmodel models); the samples and bindings
# are not.
t0=$SECONDS
mkdir -p "$dir"
if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_WERROR=ON \
     -DKILN_CUDA_ARCHITECTURES="$archs" -DKILN_BUILD_SAMPLES=OFF >"$dir/configure.log" 2>&1; then
  tail -30 "$dir/configure.log"
  echo "cuda_check: FAILED: configure (log: $dir/configure.log)" >&2
  exit 1
fi
tests=(cuda_ops_test cuda_kernels_test cuda_backend_test backend_select_test)
benches=(cuda_ops_bench)
if ! cmake --build "$dir" -j"$(nproc)" --target kiln_cuda kiln-mkmodel "${tests[@]}" "${benches[@]}"; then
  echo "cuda_check: FAILED: build" >&2
  exit 1
fi
note "build (sm_$archs): $((SECONDS - t0)) s"

for t in "${tests[@]}"; do
  t0=$SECONDS
  log="$dir/$t.log"
  # --gtest_brief would hide the skip reasons; the full output goes to the log.
  "$dir/tests/$t" >"$log" 2>&1
  rc=$?
  # One line per test ("[  SKIPPED ] Suite.Name (0 ms)"), not gtest's closing list.
  passed=$(grep -c '^\[       OK \] .* ([0-9]* ms)$' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$log")
  failures=$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$log")
  if [ $rc -ne 0 ]; then
    failed=1
    grep -B5 -A20 'Failure\|FAILED' "$log" | head -80
  fi
  note "$t: rc $rc, $passed passed, $skipped skipped, $failures failed ($((SECONDS - t0)) s; $log)"
  if [ "$skipped" -gt 0 ]; then
    grep -A1 ': Skipped$' "$log" | head -4
    # With a device visible, a skip means the module or the device could not be used.
    if [ $have_device = 1 ]; then
      failed=1
      echo "cuda_check: $t skipped tests although a device is visible" >&2
    fi
  fi
done

for b in "${benches[@]}"; do
  t0=$SECONDS
  log="$dir/$b.log"
  timeout 120 "$dir/bench/$b" >"$log" 2>&1
  rc=$?
  cat "$log"
  [ $rc -ne 0 ] && failed=1
  note "$b: rc $rc ($((SECONDS - t0)) s; $log)"
done

echo
echo "== cuda_check summary ($((SECONDS - start)) s)"
printf '  %s\n' "${summary[@]}"
if [ $failed -ne 0 ]; then
  echo "cuda_check: FAILED"
  exit 1
fi
echo "cuda_check: PASSED"
