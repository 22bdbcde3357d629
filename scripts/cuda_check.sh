#!/usr/bin/env bash
# Everything CUDA in one call, for a machine with an NVIDIA device (e.g. a lent H200), in under 8
# minutes: configure with KILN_CUDA=ON (warnings as errors), build the module and the device tests
# and benchmarks, run every device test (each device op against the CPU backend) and the device
# benchmarks, then print a summary. Exits non-zero on any failure, and at once (exit 3, before
# building) when no device is visible, so a run on the wrong machine cannot pass by skipping.
#   scripts/cuda_check.sh              # sm_90 only (KILN_CUDA_ARCHS to change; the test command
#                                      # itself builds sm_80 and sm_90)
#   KILN_CUDA_CHECK_ALLOW_NO_DEVICE=1  # build and run anyway (the device tests then skip)
#   scripts/cuda_check.sh --pack DIR      # build here (no device needed) and copy the test and
#                                        # bench programs, the module and the shared libraries
#                                        # they need beyond the C library into DIR
#   scripts/cuda_check.sh --prebuilt DIR  # on the device machine: run what --pack put in DIR
#                                        # (a lent machine has CUDA but not Abseil or GoogleTest)
#   KILN_CUDA_SANITIZE=1                 # also cuda_kernels_test under compute-sanitizer's
#                                        # memcheck (about a minute more)
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
dir="${KILN_CUDA_BUILD_DIR:-build-cuda}"
archs="${KILN_CUDA_ARCHS:-90}"
mode=build
case "${1:-}" in
  --pack) mode=pack; pack_dir="${2:?--pack DIR}" ;;
  --prebuilt) mode=prebuilt; pack_dir="$(cd "${2:?--prebuilt DIR}" && pwd)" ;;
  "") ;;
  *) echo "usage: scripts/cuda_check.sh [--pack DIR | --prebuilt DIR]" >&2; exit 2 ;;
esac
summary=()
failed=0
note() { summary+=("$1"); echo "== $1"; }
tests=(cuda_ops_test cuda_kernels_test cuda_backend_test cuda_engine_test backend_select_test)
benches=(cuda_ops_bench engine_bench)

echo "== devices"
have_device=1
[ $mode = pack ] && KILN_CUDA_CHECK_ALLOW_NO_DEVICE=1
if ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  have_device=0
  echo "cuda_check: no NVIDIA device visible (nvidia-smi -L lists none or is missing)." >&2
  if [ "${KILN_CUDA_CHECK_ALLOW_NO_DEVICE:-0}" != 1 ]; then
    echo "cuda_check: FAILED: this check needs a GPU; nothing was run." >&2
    exit 3
  fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

# The tools and tests are needed (the benches use kiln-mkmodel models); the samples and
# bindings are not.
t0=$SECONDS
if [ $mode = prebuilt ]; then
  bin="$pack_dir"
  export KILN_CUDA_MODULE="$pack_dir/libkiln_cuda.so"
  export KILN_CUDA_PARTIAL_MODULE="$pack_dir/libkiln_cuda_partial_module.so"
  # cuBLASLt from the machine's toolkit (or its Python CUDA wheels).
  cublas=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  export LD_LIBRARY_PATH="$pack_dir/lib${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  mkdir -p "$dir"  # the logs
  if ldd "$KILN_CUDA_MODULE" | grep 'not found'; then
    echo "cuda_check: FAILED: libraries of the module not found" >&2
    exit 1
  fi
  note "prebuilt programs from $pack_dir"
else
  mkdir -p "$dir"
  if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_WERROR=ON \
       -DKILN_CUDA_ARCHITECTURES="$archs" -DKILN_BUILD_SAMPLES=OFF >"$dir/configure.log" 2>&1; then
    tail -30 "$dir/configure.log"
    echo "cuda_check: FAILED: configure (log: $dir/configure.log)" >&2
    exit 1
  fi
  if ! cmake --build "$dir" -j"$(nproc)" --target kiln_cuda kiln_cuda_partial_module kiln-mkmodel \
       "${tests[@]}" "${benches[@]}"; then
    echo "cuda_check: FAILED: build" >&2
    exit 1
  fi
  note "build (sm_$archs): $((SECONDS - t0)) s"
  bin="$dir/bin-view"
  mkdir -p "$bin"
  for t in "${tests[@]}" libkiln_cuda_partial_module.so; do ln -sf "$PWD/$dir/tests/$t" "$bin/"; done
  for b in "${benches[@]}"; do ln -sf "$PWD/$dir/bench/$b" "$bin/"; done
  ln -sf "$PWD/$dir/tools/kiln-mkmodel/kiln-mkmodel" "$bin/"
  ln -sf "$PWD/$dir/kernels/cuda/libkiln_cuda.so" "$bin/"
fi

if [ $mode = pack ]; then
  rm -rf "$pack_dir" && mkdir -p "$pack_dir/lib"
  cp -L "$bin"/* "$pack_dir/"
  # The shared libraries beyond the C library, the C++ runtime and CUDA's (Abseil).
  for f in "$pack_dir"/*; do ldd "$f" 2>/dev/null; done | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/lib(c|m|dl|rt|pthread|gcc_s|stdc\+\+)\.so|libcu|/cuda' | xargs -r cp -L -t "$pack_dir/lib"
  cp "$0" "$pack_dir/"
  echo "cuda_check: packed into $pack_dir ($(du -sh "$pack_dir" | cut -f1)):"
  ls "$pack_dir" "$pack_dir/lib"
  exit 0
fi

for t in "${tests[@]}"; do
  t0=$SECONDS
  log="$dir/$t.log"
  # --gtest_brief would hide the skip reasons; the full output goes to the log.
  timeout 300 "$bin/$t" >"$log" 2>&1
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

# Out-of-bounds and misaligned device accesses in the kernels (a test can pass while a kernel
# reads past a buffer): memcheck needs the GPU's debug interface, which a Firecracker machine
# gives and a gVisor one does not.
if [ "${KILN_CUDA_SANITIZE:-0}" = 1 ]; then
  t0=$SECONDS
  log="$dir/memcheck.log"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout 300 "$sanitizer" --tool memcheck --error-exitcode 9 "$bin/cuda_kernels_test" >"$log" 2>&1
  rc=$?
  grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$log" | head -20
  [ $rc -ne 0 ] && failed=1
  note "compute-sanitizer memcheck of cuda_kernels_test: rc $rc ($((SECONDS - t0)) s; $log)"
fi

t0=$SECONDS
log="$dir/cuda_ops_bench.log"
timeout 120 "$bin/cuda_ops_bench" >"$log" 2>&1
rc=$?
cat "$log"
[ $rc -ne 0 ] && failed=1
note "cuda_ops_bench: rc $rc ($((SECONDS - t0)) s; $log)"

# Whole-model decode on the device: kiln-mkmodel models of the default model's shape (Q4_1, as
# the default file) and of DeepSeek-V2's (MLA) shape.
for m in "smollm2-135m q4_1" "deepseek2-bench q8_0"; do
  set -- $m
  t0=$SECONDS
  gguf="$dir/$1-$2.gguf"
  log="$dir/engine_bench-$1.log"
  "$bin/kiln-mkmodel" --shape "$1" --type "$2" --out "$gguf" >/dev/null &&
    timeout 180 "$bin/engine_bench" --model "$gguf" --backend cuda --threads 4 --repeats 3 \
      --decode 64 >"$log" 2>&1
  rc=$?
  cat "$log"
  [ $rc -ne 0 ] && failed=1
  note "engine_bench --backend cuda $1 $2: rc $rc ($((SECONDS - t0)) s; $log)"
done

echo
echo "== cuda_check summary ($((SECONDS - start)) s)"
printf '  %s\n' "${summary[@]}"
if [ $failed -ne 0 ]; then
  echo "cuda_check: FAILED"
  exit 1
fi
echo "cuda_check: PASSED"
