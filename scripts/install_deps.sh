#!/usr/bin/env bash
# Installs what building and testing kiln needs on Debian 12. Idempotent: apt runs only when a
# package is missing.
set -euo pipefail

packages=(build-essential cmake pkg-config git python3 python3-pip
          python3-venv  # scripts/test_bindings.sh: the Python binding's virtual environment
          golang-go  # scripts/test_bindings.sh: the Go binding (cgo)
          cargo rustc  # scripts/test_bindings.sh: the Rust binding (Debian's 1.63 is its minimum)
          mono-devel  # scripts/test_bindings.sh: the C# binding (mcs, mono)
          libabsl-dev libprotobuf-dev protobuf-compiler libgtest-dev libgmock-dev googletest
          clang libclang-rt-14-dev clang-format
          qemu-user valgrind  # scripts/test_cpu_portability.sh: other CPUs, memcheck
          libcpp-httplib-dev nlohmann-json3-dev  # samples/server (an HTTP server and JSON)
          nginx  # samples/server's scale-out test (replicas behind nginx)
          libsdl2-dev libsdl2-ttf-dev fonts-dejavu-core  # samples/game (window, text, its font)
          libimgui-dev  # samples/chat-desktop (Dear ImGui with its SDL2 and OpenGL 3 backends)
          xvfb  # samples/game and samples/chat-desktop: a window without a display
          g++-mingw-w64-x86-64-posix wine wine64  # scripts/test_windows.sh: kiln.dll under wine
          ccache)  # scripts/test_windows.sh: the cross build's objects kept between runs
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# samples/server's test drives the server with the official OpenAI client (PyPI only). pip's
# --break-system-packages is needed only where python3 is Debian's own (PEP 668).
if ! python3 -c "import openai, pytest" >/dev/null 2>&1; then
  echo "install_deps: installing the Python modules openai and pytest"
  python3 -m pip install --quiet openai pytest ||
    python3 -m pip install --quiet --break-system-packages openai pytest
fi
