#!/usr/bin/env bash
# Builds the static archives KILN_STATIC_DEPS needs, fit for a shared library: Abseil and the
# Protobuf lite runtime, position-independent (-fPIC, so thread_locals use a TLS model a shared
# object allows), from Debian 12's own sources of the versions Debian ships (the same code and
# inline namespace as libabsl-dev's headers, the same Protobuf as protoc). Debian's packaged
# archives are built as PIE and cannot go into libkiln.so (see cmake/StaticDeps.cmake).
#
# Usage: scripts/build_static_deps.sh PREFIX
# then:  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=PREFIX
#        (KILN_STATIC_DEPS=AUTO turns on by itself; =ON fails if it cannot.)
#
# The sources come through apt-get source, pinned and checked (scripts/lib/debian_sources.sh).
# 8 to 18 minutes on two shared cores (Abseil 436-785 s, Protobuf lite 73-247 s, measured).
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$(realpath -m "$1")
jobs=$(nproc)

source "$(dirname "$0")/lib/debian_sources.sh"
debian_sources_check_installed

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-static-deps.XXXXXX")
trap 'rm -rf "$work"' EXIT
debian_sources_fetch "$work"
cd "$work"

start=$SECONDS
cmake -S abseil -B absl-build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build absl-build -j"$jobs" >/dev/null
cmake --install absl-build >/dev/null
echo "build_static_deps: Abseil in $((SECONDS - start)) s"

start=$SECONDS
cmake -S protobuf -B protobuf-build -DCMAKE_BUILD_TYPE=Release -Dprotobuf_BUILD_TESTS=OFF \
  -Dprotobuf_BUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -Dprotobuf_BUILD_PROTOC_BINARIES=OFF -Dprotobuf_WITH_ZLIB=OFF >/dev/null
cmake --build protobuf-build -j"$jobs" --target libprotobuf-lite >/dev/null
# Only the lite runtime: the headers and protoc stay Debian's (the same version).
install -D -m 644 protobuf-build/libprotobuf-lite.a "$prefix/lib/libprotobuf-lite.a"
echo "build_static_deps: Protobuf lite in $((SECONDS - start)) s"
echo "build_static_deps: done; configure kiln with -DCMAKE_PREFIX_PATH=$prefix"
