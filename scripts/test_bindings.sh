#!/usr/bin/env bash
# The language bindings' tests (bindings/<language>/) against a built libkiln, on the default
# model (scripts/fetch_model.sh) and on fixtures written first into BUILD_DIR/bindings-fixtures
# (KILN_BINDINGS_FIXTURES) with BUILD_DIR's tools: tiny-deepseek2.gguf (kiln-mkmodel) and
# SmolLM2-135M-Instruct.eagle.gguf, an untrained EAGLE head for the default model (kiln-mkeagle);
# - Python: a virtual environment in BUILD_DIR/bindings-python-venv with pytest, the package
#   installed from bindings/python with that libkiln bundled (pip install), its tests run from
#   outside the source tree so that they import the installed package;
# - Rust: cargo test --offline of bindings/rust (kiln-sys, kiln) linked to BUILD_DIR's libkiln,
#   with Debian's Rust 1.63 (the crates' minimum) and rustup's where installed, built in
#   BUILD_DIR/bindings-rust-target/<rustc version>;
# - Go: go test of bindings/go (cgo, std only) linked to BUILD_DIR's libkiln, its build cache in
#   BUILD_DIR/bindings-go-cache;
# - C#: Kiln.dll and its test runner built with mono's mcs into BUILD_DIR/bindings-csharp, run
#   with mono on BUILD_DIR's libkiln.
# Usage: scripts/test_bindings.sh [BUILD_DIR] (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$(realpath "${1:-build}")
lib_dir=$build/lib/c_api
[[ -f $lib_dir/libkiln.so.1 ]] || { echo "test_bindings: no $lib_dir/libkiln.so.1: build first" >&2; exit 1; }

start=$SECONDS
mkmodel=$build/tools/kiln-mkmodel/kiln-mkmodel
mkeagle=$build/tools/kiln-mkeagle/kiln-mkeagle
for tool in "$mkmodel" "$mkeagle"; do
  [[ -x $tool ]] || { echo "test_bindings: no $tool: build the kiln-mkmodel and kiln-mkeagle targets" >&2; exit 1; }
done
export KILN_BINDINGS_FIXTURES=$build/bindings-fixtures
mkdir -p "$KILN_BINDINGS_FIXTURES"
"$mkmodel" --shape tiny-deepseek2 --type f32 --seed 16 --out "$KILN_BINDINGS_FIXTURES/tiny-deepseek2.gguf" >/dev/null
"$mkeagle" "$(scripts/fetch_model.sh)" "$KILN_BINDINGS_FIXTURES/SmolLM2-135M-Instruct.eagle.gguf" 2>/dev/null
echo "test_bindings: fixtures in $((SECONDS - start)) s"

start=$SECONDS
venv=$build/bindings-python-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
# The build tools live in the venv too (no isolated build environment to download on each run).
"$venv/bin/python" -m pip install -q --disable-pip-version-check pytest "setuptools>=61" wheel
KILN_LIBRARY=$lib_dir/libkiln.so.1 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --force-reinstall --no-deps "$root/bindings/python"
(cd "$build" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/bindings/python/tests")
echo "test_bindings: Python in $((SECONDS - start)) s"

start=$SECONDS
# Debian 12's Rust (1.63, /usr/bin) is the binding's declared minimum (rust-version): building and
# testing with it is the MSRV check. A newer toolchain from rustup (~/.cargo/bin, perhaps not on a
# non-login shell's PATH) runs the tests too, for what newer compilers reject.
[[ -x /usr/bin/cargo && -x /usr/bin/rustc ]] ||
  { echo "test_bindings: no /usr/bin/cargo (scripts/install_deps.sh installs Debian's cargo and rustc)" >&2; exit 1; }
rust_test() {  # PATH: where cargo, rustc and rustdoc come from
  (cd bindings/rust && PATH=$1 KILN_LIB_DIR=$lib_dir \
     CARGO_TARGET_DIR=$build/bindings-rust-target/$("${1%%:*}/rustc" --version | cut -d' ' -f2) \
     cargo test --offline --quiet)
}
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' bindings/rust/Cargo.toml)
echo "test_bindings: Rust $(/usr/bin/rustc --version | cut -d' ' -f2) (Debian's; the crates' rust-version $msrv)"
rust_test "/usr/bin:$PATH"
rustup_bin=${CARGO_HOME:-$HOME/.cargo}/bin
if [[ -x $rustup_bin/cargo ]]; then
  echo "test_bindings: Rust $("$rustup_bin/rustc" --version | cut -d' ' -f2) (rustup's)"
  rust_test "$rustup_bin:$PATH"
fi
echo "test_bindings: Rust in $((SECONDS - start)) s"

start=$SECONDS
command -v go >/dev/null || { echo "test_bindings: no go (scripts/install_deps.sh installs golang-go)" >&2; exit 1; }
# No module proxy: the module uses the standard library only.
(cd bindings/go && export GOFLAGS=-mod=mod GOPROXY=off GOCACHE=$build/bindings-go-cache \
   CGO_LDFLAGS="-L$lib_dir -Wl,-rpath,$lib_dir" && go vet ./... && go test -count=1 ./...)
echo "test_bindings: Go in $((SECONDS - start)) s"

start=$SECONDS
command -v mcs >/dev/null || { echo "test_bindings: no mcs (scripts/install_deps.sh installs mono-devel)" >&2; exit 1; }
bindings/csharp/build.sh "$build/bindings-csharp"
# DllImport("kiln") finds libkiln.so through the loader's search path.
(cd "$build/bindings-csharp" && LD_LIBRARY_PATH=$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} mono KilnTests.exe)
echo "test_bindings: C# in $((SECONDS - start)) s"
