#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, fetch the default model, use it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh build
model=$(scripts/fetch_model.sh)
build/tools/kiln/kiln info "$model"
build/tools/kiln/kiln tokenize -m "$model" "Hello from kiln! Tokenizing some text: 12345."
