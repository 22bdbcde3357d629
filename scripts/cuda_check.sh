#!/usr/bin/env bash
# Everything CUDA in one call, for a machine with an NVIDIA device (e.g. a lent H200):
# configure with KILN_CUDA=ON, build, run the CUDA op tests (which compare every device op with
# the CPU reference), print the device. Exits non-zero on any failure; a test that finds no
# device skips with the reason, so on such a machine look for "SKIPPED" in the output.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L 2>/dev/null || echo "cuda_check: nvidia-smi not available"
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_WERROR=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${KILN_CUDA_ARCHS:-90}" >/dev/null
cmake --build build-cuda -j"$(nproc)" --target kiln_cuda cuda_ops_test
build-cuda/tests/cuda_ops_test
