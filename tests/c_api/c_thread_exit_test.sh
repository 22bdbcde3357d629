#!/usr/bin/env bash
# Runs c_thread_exit_test on a tiny random-weight model written by kiln-mkmodel.
#   c_thread_exit_test.sh KILN_MKMODEL C_THREAD_EXIT_TEST [ROUNDS]
set -euo pipefail
mkmodel="$1"
program="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mkmodel" --shape tiny-llama-gqa --type q8_0 --seed 23 --out "$tmp/tiny.gguf" >/dev/null
"$program" "$tmp/tiny.gguf" "${3:-16}"
