#!/usr/bin/env bash
# Runs a C API test program on a tiny random-weight model written by kiln-mkmodel:
#   tiny_model_test.sh KILN_MKMODEL PROGRAM [ARGS...]   runs PROGRAM TINY.gguf [ARGS...]
# (c_stress_test always; c_scheduler_test under ThreadSanitizer, see CMakeLists.txt.)
set -euo pipefail
mkmodel="$1"
program="$2"
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mkmodel" --shape tiny-llama-gqa --type q8_0 --seed 23 --out "$tmp/tiny.gguf" >/dev/null
"$program" "$tmp/tiny.gguf" "$@"
