#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, fetch the default model, use it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh build
model=$(scripts/fetch_model.sh)
build/tools/kiln/kiln info "$model"
build/tools/kiln/kiln tokenize -m "$model" "Hello from kiln! Tokenizing some text: 12345."
# The main job: the default model answers a question through its chat template (streamed to
# stdout; prompt/decode tokens per second on stderr).
build/tools/kiln/kiln generate -m "$model" --temp 0 -n 64 \
  -p "In two sentences, why is the sky blue?"
