# Sourced by scripts/build_static_deps.sh and scripts/build_mingw_deps.sh: Debian 12's own sources
# of the Abseil and Protobuf that Debian ships (the same code and inline namespace as libabsl-dev's
# headers, the same Protobuf as protoc), fetched and pinned in one place.
#
# They come through apt-get source with a private source list (the system's apt setup is not
# touched), which checks them against Debian's signed index; the hashes below pin them too.

debian_absl_version=20220623.1-1+deb12u2
debian_protobuf_version=3.21.12-3+deb12u1
declare -A debian_source_sha256=(
  [abseil_20220623.1.orig.tar.gz]=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
  [abseil_20220623.1-1+deb12u2.debian.tar.xz]=e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb
  [protobuf_3.21.12.orig.tar.gz]=930c2c3b5ecc6c9c12615cf5ad93f1cd6e12d0aba862b572e076259970ac3a53
  [protobuf_3.21.12-3+deb12u1.debian.tar.xz]=49cdad49801545cb797355af19fbd6b3627084c6549f629512faaa4e25dd5647
)

# A key naming exactly these sources: a cache of what was built from them is valid while it holds.
debian_sources_key() {
  printf '%s\n' "$debian_absl_version" "$debian_protobuf_version" "${debian_source_sha256[@]}" |
    sort | sha256sum | cut -c1-16
}

# Warns when the installed -dev packages are other versions than these sources (their headers or
# protoc would then not match what is built from them).
debian_sources_check_installed() {
  local pkg have
  for pkg in libabsl-dev:$debian_absl_version libprotobuf-dev:$debian_protobuf_version; do
    have=$(dpkg-query -W -f='${Version}' "${pkg%%:*}" 2>/dev/null || true)
    [[ $have == "${pkg#*:}" ]] ||
      echo "debian_sources: warning: ${pkg%%:*} is '$have', the sources built are ${pkg#*:}" >&2
  done
}

# Fetches, checks and unpacks both into DIR/abseil and DIR/protobuf.
debian_sources_fetch() {
  local dir=$1 file
  mkdir -p "$dir/lists/partial"
  printf 'deb-src http://deb.debian.org/debian bookworm main\n%s\n' \
    'deb-src http://deb.debian.org/debian-security bookworm-security main' >"$dir/sources.list"
  local apt_options=(-o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
                     -o Dir::State::Lists="$dir/lists" -o APT::Sandbox::User=root)
  apt-get "${apt_options[@]}" update -qq
  (cd "$dir" && apt-get "${apt_options[@]}" source --download-only -qq \
     "abseil=$debian_absl_version" "protobuf=$debian_protobuf_version")
  for file in "${!debian_source_sha256[@]}"; do
    (cd "$dir" && echo "${debian_source_sha256[$file]}  $file" | sha256sum --check --quiet)
  done
  (cd "$dir" && dpkg-source -x --no-check "abseil_$debian_absl_version.dsc" abseil >/dev/null &&
     dpkg-source -x --no-check "protobuf_$debian_protobuf_version.dsc" protobuf >/dev/null)
}
