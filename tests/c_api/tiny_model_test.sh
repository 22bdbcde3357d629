#!/usr/bin/env bash
# Runs c_stress_test on a tiny random-weight model written by kiln-mkmodel.
#   c_stress_test.sh KILN_MKMODEL C_STRESS_TEST [SECONDS]
# SECONDS defaults to $KILN_STRESS_SECONDS, else 5 (scripts/test.sh's sanitizer stages set 30).
set -euo pipefail
mkmodel="$1"
stress="$2"
seconds="${3:-${KILN_STRESS_SECONDS:-5}}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mkmodel" --shape tiny-llama-gqa --type q8_0 --seed 23 --out "$tmp/tiny.gguf" >/dev/null
"$stress" "$tmp/tiny.gguf" "$seconds"
