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
# The sources come through apt-get source (a private source list: the system's apt setup is not
# touched), which checks them against Debian's signed index; the hashes below pin them too.
# 8 to 18 minutes on two shared cores (Abseil 436-785 s, Protobuf lite 73-247 s, measured).
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$(realpath -m "$1")
jobs=$(nproc)

absl_version=20220623.1-1+deb12u2
protobuf_version=3.21.12-3+deb12u1
declare -A sha256=(
  [abseil_20220623.1.orig.tar.gz]=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
  [abseil_20220623.1-1+deb12u2.debian.tar.xz]=e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb
  [protobuf_3.21.12.orig.tar.gz]=930c2c3b5ecc6c9c12615cf5ad93f1cd6e12d0aba862b572e076259970ac3a53
  [protobuf_3.21.12-3+deb12u1.debian.tar.xz]=49cdad49801545cb797355af19fbd6b3627084c6549f629512faaa4e25dd5647
)

for pkg in libabsl-dev:$absl_version libprotobuf-dev:$protobuf_version; do
  have=$(dpkg-query -W -f='${Version}' "${pkg%%:*}" 2>/dev/null || true)
  [[ $have == "${pkg#*:}" ]] ||
    echo "build_static_deps: warning: ${pkg%%:*} is '$have', these archives are ${pkg#*:}" >&2
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-static-deps.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir -p lists/partial
printf 'deb-src http://deb.debian.org/debian bookworm main\n%s\n' \
  'deb-src http://deb.debian.org/debian-security bookworm-security main' >sources.list
apt_options=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
             -o Dir::State::Lists="$work/lists" -o APT::Sandbox::User=root)
apt-get "${apt_options[@]}" update -qq
apt-get "${apt_options[@]}" source --download-only -qq "abseil=$absl_version" "protobuf=$protobuf_version"
for file in "${!sha256[@]}"; do
  echo "${sha256[$file]}  $file" | sha256sum --check --quiet
done
dpkg-source -x --no-check "abseil_$absl_version.dsc" abseil >/dev/null
dpkg-source -x --no-check "protobuf_$protobuf_version.dsc" protobuf >/dev/null

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
