# Cross-compiling kiln for 64-bit Windows with Debian's mingw-w64 (g++-mingw-w64-x86-64-posix: the
# posix threading model, which std::thread and std::mutex need). Used by scripts/test_windows.sh
# and scripts/build_mingw_deps.sh:
#   cmake -S . -B build-windows -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake \
#         -DCMAKE_PREFIX_PATH=<scripts/build_mingw_deps.sh's prefix>
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(KILN_MINGW_TRIPLE x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${KILN_MINGW_TRIPLE}-gcc-posix)
set(CMAKE_CXX_COMPILER ${KILN_MINGW_TRIPLE}-g++-posix)
set(CMAKE_RC_COMPILER ${KILN_MINGW_TRIPLE}-windres)
set(CMAKE_AR ${KILN_MINGW_TRIPLE}-gcc-ar-posix CACHE FILEPATH "")
set(CMAKE_RANLIB ${KILN_MINGW_TRIPLE}-gcc-ranlib-posix CACHE FILEPATH "")
# Programs (protoc) come from the host; libraries and headers only from mingw's sysroot and the
# prefixes given with CMAKE_PREFIX_PATH (never the host's /usr/include).
# (The prefixes are roots of their own: a root-only search re-roots every other path.)
set(CMAKE_FIND_ROOT_PATH /usr/${KILN_MINGW_TRIPLE} ${CMAKE_PREFIX_PATH})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# libgcc and libstdc++ linked in statically: kiln.dll and the programs need no mingw DLL beside
# them but libwinpthread-1.dll, which stays shared: a program and kiln.dll with a static copy each
# would run two threading runtimes, and a process whose threads called into kiln.dll then hangs
# at exit.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static-libgcc -static-libstdc++")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static-libgcc -static-libstdc++")
# ctest runs the cross-built programs through wine when it is installed.
find_program(KILN_WINE wine)
if(KILN_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KILN_WINE})
endif()
