#!/usr/bin/env bash
# Builds llama.cpp's own C++ tools, the peer of bench/: llama-bench, llama-batched-bench,
# llama-perplexity and llama-server, from the vendor/llama.cpp of the llama-cpp-python source
# package (the same llama.cpp the Python goldens come from), into a cache outside the repo.
# Idempotent: a second run with the tools present only prints their directory.
# Usage: bench/build_llama_cpp.sh [VERSION]   (default 0.3.36)
# Prints the directory holding the binaries (last line of stdout).
set -euo pipefail
version="${1:-0.3.36}"
cache="${KILN_CACHE_DIR:-$HOME/.cache/kiln}/llama.cpp-$version"
bin="$cache/build/bin"
tools=(llama-bench llama-batched-bench llama-perplexity llama-server)

have_all() {
  for t in "${tools[@]}"; do [[ -x "$bin/$t" ]] || return 1; done
}
if have_all; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
if [[ ! -f "$cache/src/vendor/llama.cpp/CMakeLists.txt" ]]; then
  tarball="$cache/sdist/llama_cpp_python-$version.tar.gz"
  [[ -f "$tarball" ]] || python3 -m pip download --no-binary :all: --no-deps -q \
    -d "$cache/sdist" "llama-cpp-python==$version" >&2
  rm -rf "$cache/src"
  mkdir -p "$cache/src"
  tar xzf "$tarball" -C "$cache/src" --strip-components=1
fi
# GGML_NATIVE: the instructions this CPU has, as kiln's run-time dispatch uses them.
cmake -S "$cache/src/vendor/llama.cpp" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$cache/build" -j"$(nproc)" --target "${tools[@]}" >&2
have_all || { echo "build_llama_cpp: tools missing in $bin" >&2; exit 1; }
echo "$bin"
