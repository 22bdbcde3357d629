#!/usr/bin/env bash
# Packaging: a C consumer (consumer/) finds, builds against and runs kiln the three ways a user
# would:
#   1. find_package(kiln) against this build tree (kiln_DIR=<build>);
#   2. `cmake --install` into a staging prefix, then the installed tree MOVED elsewhere: the
#      consumer builds with `pkg-config --cflags --libs kiln` (PKG_CONFIG_PATH at the moved tree)
#      and with find_package(kiln) (CMAKE_PREFIX_PATH at the moved tree): both packages must
#      find the moved tree, not the staging prefix;
#   3. add_subdirectory(<kiln source>) + kiln::kiln: configured and generated only (building
#      the whole engine again takes minutes), unless KILN_PACKAGING_BUILD_SUBDIR=1.
# Each consumer that is built must run and print the version of the header it was compiled
# with. Each one's kiln::kiln must hand out an include directory that holds kiln/kiln.h.
#
# Usage: packaging_test.sh CMAKE SOURCE_DIR BUILD_DIR C_COMPILER VERSION
set -euo pipefail

cmake=$1
source_dir=$(realpath "$2")
build_dir=$3
cc=$4
version=$5
consumer=$source_dir/tests/packaging/consumer

work=$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/kiln-packaging.XXXXXX")")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The consumer's output must be exactly the version line.
expect_runs() {
  local what=$1
  shift
  local out
  out=$("$@") || fail "$what: the consumer exited with $?"
  [[ $out == "kiln $version abi "* ]] || fail "$what: printed '$out', want 'kiln $version abi N'"
  echo "$what: $out"
}

# Every include directory kiln::kiln hands out exists and holds kiln/kiln.h (and lies under $2).
expect_includes() {
  local what=$1 root=$2 list=$3 n=0
  while IFS= read -r dir; do
    [[ -z $dir ]] && continue
    n=$((n + 1))
    dir=$(realpath -m "$dir")
    [[ -f $dir/kiln/kiln.h ]] || fail "$what: include directory '$dir' has no kiln/kiln.h"
    [[ $dir == "$root"/* ]] || fail "$what: include directory '$dir' is outside $root"
  done <"$list"
  ((n > 0)) || fail "$what: kiln::kiln has no include directory"
}

configure() {
  "$cmake" -S "$consumer" -B "$1" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release \
    -DKILN_EXPECTED_VERSION="$version" "${@:2}" >"$1.log" 2>&1 ||
    { cat "$1.log" >&2; fail "configuring $1"; }
}

build() {
  "$cmake" --build "$1" >>"$1.log" 2>&1 || { cat "$1.log" >&2; fail "building $1"; }
}

command -v pkg-config >/dev/null || fail "pkg-config is not installed (scripts/install_deps.sh)"

# --- 1. The build tree as a package.
[[ -f $build_dir/kilnConfig.cmake && -f $build_dir/kilnTargets.cmake ]] ||
  fail "no kilnConfig.cmake / kilnTargets.cmake in $build_dir"
configure "$work/from-build" -Dkiln_DIR="$build_dir"
build "$work/from-build"
expect_includes "build tree" "$source_dir" "$work/from-build/kiln_include_dirs.txt"
expect_runs "find_package, build tree" "$work/from-build/kiln_consumer"

# --- 2. An installed tree, moved after installing.
"$cmake" --install "$build_dir" --prefix "$work/staging" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install"; }
mkdir "$work/elsewhere"
mv "$work/staging" "$work/elsewhere/kiln"
moved=$work/elsewhere/kiln
pc=$(find "$moved" -name kiln.pc -path '*/pkgconfig/*')
[[ -n $pc ]] || fail "no pkgconfig/kiln.pc in the installed tree"
libdir=$(dirname "$(dirname "$pc")")
[[ -e $libdir/libkiln.so ]] || fail "no libkiln.so next to pkgconfig/ ($libdir)"

PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
pc_version=$(pkg-config --modversion kiln)
[[ $pc_version == "$version" ]] || fail "kiln.pc says version $pc_version, want $version"
read -r -a flags <<<"$(pkg-config --cflags --libs kiln)"
for f in "${flags[@]}"; do
  case $f in
    -I* | -L*)
      dir=$(realpath -m "${f:2}")
      [[ $dir == "$moved"/* ]] || fail "pkg-config flag $f is outside the moved tree $moved"
      ;;
  esac
done
"$cc" -std=c11 -Wall -Werror "$consumer/main.c" "${flags[@]}" -o "$work/pc_consumer" ||
  fail "compiling the consumer with pkg-config's flags: ${flags[*]}"
expect_runs "pkg-config, moved install" env LD_LIBRARY_PATH="$libdir" "$work/pc_consumer"

configure "$work/from-install" -DCMAKE_PREFIX_PATH="$moved"
grep -q "from $moved/" "$work/from-install.log" || fail "find_package did not use $moved"
build "$work/from-install"
expect_includes "moved install" "$moved" "$work/from-install/kiln_include_dirs.txt"
expect_runs "find_package, moved install" \
  env LD_LIBRARY_PATH="$libdir" "$work/from-install/kiln_consumer"

# --- 3. add_subdirectory(kiln).
configure "$work/subdir" -DKILN_SOURCE_DIR="$source_dir" -DKILN_CUDA=OFF
expect_includes "add_subdirectory" "$source_dir" "$work/subdir/kiln_include_dirs.txt"
if grep -q "KILN_BUILD_TESTS:BOOL=ON" "$work/subdir/CMakeCache.txt"; then
  fail "add_subdirectory: KILN_BUILD_TESTS defaults to ON for a consumer"
fi
if [[ ${KILN_PACKAGING_BUILD_SUBDIR:-0} == 1 ]]; then
  "$cmake" --build "$work/subdir" -j2 >>"$work/subdir.log" 2>&1 ||
    { tail -50 "$work/subdir.log" >&2; fail "building add_subdirectory consumer"; }
  expect_runs "add_subdirectory" "$work/subdir/kiln_consumer"
else
  echo "add_subdirectory: configured and generated (KILN_PACKAGING_BUILD_SUBDIR=1 also builds)"
fi
echo "PASS"
