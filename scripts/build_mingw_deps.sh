#!/usr/bin/env bash
# Cross-builds what the Windows build of kiln links and Debian ships no mingw-w64 package of:
# Abseil (only the libraries kiln links), the Protobuf lite runtime (Debian 12's own sources:
# scripts/lib/debian_sources.sh) and GoogleTest without GoogleMock (Debian's googletest package,
# /usr/src/googletest),
# as static archives into a cache outside the repository, keyed by the sources, the toolchain
# file and the compiler: a second run with the same key does nothing.
#
# Usage: scripts/build_mingw_deps.sh   (prints the prefix on stdout, progress on stderr)
# then:  cmake -S . -B build-windows -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake \
#          -DCMAKE_PREFIX_PATH=<prefix>
# protoc stays the host's (Debian's protobuf-compiler, the same 3.21.12).
# 97 s cold on two idle cores (Abseil 55 s, Protobuf lite 22 s, GoogleTest 17 s; at a load
# average of 15-17 it took 27 minutes); a cache hit takes under a second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/debian_sources.sh"
toolchain=$root/cmake/mingw-w64-x86_64.cmake
jobs=$(nproc)
# Bumped whenever what this script builds, or how, changes (the cache key includes it).
recipe_version=2

gtest_version=$(dpkg-query -W -f='${Version}' googletest)
compiler_version=$(x86_64-w64-mingw32-g++-posix -dumpfullversion)
key=$( { debian_sources_key; echo "$recipe_version $gtest_version $compiler_version"; cat "$toolchain"; } |
       sha256sum | cut -c1-16)
prefix=${KILN_MINGW_DEPS_CACHE:-$HOME/.cache/kiln}/mingw-deps-$key
if [[ -f $prefix/.complete ]]; then
  echo "$prefix"
  exit 0
fi
debian_sources_check_installed

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-mingw-deps.XXXXXX")
trap 'rm -rf "$work"' EXIT
staging=$work/prefix
debian_sources_fetch "$work" >&2
cd "$work"
# Each step's output (third-party warnings included) goes to a log, shown only if the step fails.
quietly() {
  "$@" >"$work/step.log" 2>&1 || { tail -n 40 "$work/step.log" >&2; return 1; }
}
cross=(-DCMAKE_TOOLCHAIN_FILE="$toolchain" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
       -DCMAKE_INSTALL_PREFIX="$staging" -DCMAKE_PREFIX_PATH="$staging")

# Abseil: only the libraries kiln links (and what they depend on): about half of Abseil. Its
# install step copies every library of the project, so the ones not built are installed as empty
# archives: abslConfig.cmake stays Abseil's own, and linking one of those by mistake fails.
start=$SECONDS
quietly cmake -S abseil -B absl-build "${cross[@]}" -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON \
  -DBUILD_TESTING=OFF
# (Target names without absl_: Abseil's own names when it is the top-level project.)
quietly cmake --build absl-build -j"$jobs" --target status statusor strings str_format_internal \
  raw_hash_set hash synchronization
grep -rhoE '"[^"]*/libabsl_[a-z0-9_]+\.a"' absl-build --include=cmake_install.cmake | tr -d '"' |
  sort -u | while read -r archive; do
    [[ -f $archive ]] || x86_64-w64-mingw32-ar rc "$archive"
  done
quietly cmake --install absl-build
echo "build_mingw_deps: Abseil in $((SECONDS - start)) s" >&2

# Protobuf: the lite runtime only, with the headers of its sources.
start=$SECONDS
quietly cmake -S protobuf -B protobuf-build "${cross[@]}" -Dprotobuf_BUILD_TESTS=OFF \
  -Dprotobuf_BUILD_SHARED_LIBS=OFF -Dprotobuf_BUILD_PROTOC_BINARIES=OFF -Dprotobuf_WITH_ZLIB=OFF
quietly cmake --build protobuf-build -j"$jobs" --target libprotobuf-lite
install -D -m 644 protobuf-build/libprotobuf-lite.a "$staging/lib/libprotobuf-lite.a"
(cd protobuf/src && find google -name '*.h' -o -name '*.inc' | grep -v -e /testing/ -e _test |
   while read -r header; do install -D -m 644 "$header" "$staging/include/$header"; done)
echo "build_mingw_deps: Protobuf lite in $((SECONDS - start)) s" >&2

# GoogleTest without GoogleMock: only platform_test uses it (tests/CMakeLists.txt).
start=$SECONDS
quietly cmake -S /usr/src/googletest -B gtest-build "${cross[@]}" -DBUILD_GMOCK=OFF
quietly cmake --build gtest-build -j"$jobs"
quietly cmake --install gtest-build
echo "build_mingw_deps: GoogleTest in $((SECONDS - start)) s" >&2

touch "$staging/.complete"
mkdir -p "$(dirname "$prefix")"
rm -rf "$prefix"
mv "$staging" "$prefix"
echo "$prefix"
