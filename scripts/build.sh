#!/usr/bin/env bash
# Configures and builds one build tree. Usage: scripts/build.sh DIR [cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$1"; shift
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
