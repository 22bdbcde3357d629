#!/usr/bin/env bash
# Builds Kiln.dll, the tests (KilnTests.exe) and the example (Chat.exe) into OUT_DIR with mono's
# mcs (Debian's mono-devel), against the .NET Framework 4.x profile, which Unity and desktop .NET
# load. Usage: bindings/csharp/build.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
mcs=(mcs -langversion:7 -sdk:4.5 -warnaserror -nologo)
"${mcs[@]}" -target:library -optimize -out:"$out/Kiln.dll" "$here"/src/*.cs
"${mcs[@]}" -out:"$out/KilnTests.exe" -r:"$out/Kiln.dll" -r:System.Core.dll "$here"/tests/*.cs
"${mcs[@]}" -out:"$out/Chat.exe" -r:"$out/Kiln.dll" -r:System.Core.dll "$here"/examples/*.cs
