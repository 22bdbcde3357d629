"""Where libkiln is looked for (the README's "Finding libkiln"), on Linux and on Windows.

No import of ctypes' loader here, and no side effect: `candidates()` only lists paths, so it can be
checked for any platform from any other (scripts/test_windows.sh lists the Windows ones on Linux).
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from pathlib import Path
from typing import Mapping, Optional

ABI_VERSION = 1
SONAME = f"libkiln.so.{ABI_VERSION}"
# Windows: the DLL has no version in its name (the C API's kiln_abi_version() is checked instead);
# the one mingw DLL it needs, libwinpthread-1.dll, lies beside it, where the loader looks for the
# dependencies of a DLL loaded by its full path.
DLL = "kiln.dll"


def library_names(platform: str) -> tuple[str, ...]:
    """The file names of libkiln on `platform` (a value of sys.platform), preferred first."""
    if platform == "win32":
        return (DLL,)
    return (SONAME, "libkiln.so")


def build_tree_paths(repo: Path, platform: str) -> list[Path]:
    """Where a build of the checkout `repo` puts libkiln: the release build tree; on Windows also
    scripts/test_windows.sh's cross build (programs and DLLs together in build-windows/bin)."""
    if platform == "win32":
        return [repo / "build" / "lib" / "c_api" / DLL, repo / "build-windows" / "bin" / DLL]
    return [repo / build / "lib" / "c_api" / SONAME for build in ("build", "build-release")]


def candidates(platform: str = sys.platform, environ: Optional[Mapping[str, str]] = None,
               package_dir: Optional[Path] = None) -> list[str]:
    """The paths (or, last, a bare name for the system's loader) to try in order."""
    environ = os.environ if environ is None else environ
    env = environ.get("KILN_LIBRARY")
    if env:
        # An explicit choice: only this file, so a wrong path is an error, not a silent fallback.
        return [env]
    here = package_dir or Path(__file__).resolve().parent
    found: list[str] = []
    # Bundled into the installed package (pip install copies a built libkiln next to it).
    for name in library_names(platform):
        if (here / name).exists():
            found.append(str(here / name))
    # Run from a source checkout: the build trees of the repository this package lies in.
    for lib in build_tree_paths(here.parent.parent.parent, platform):
        if lib.exists():
            found.append(str(lib))
    # Installed system-wide: the dynamic loader's search path (Linux), or a folder on PATH
    # (Windows, where find_library returns the full path the loader needs).
    system = ctypes.util.find_library("kiln") if platform == sys.platform else None
    found.append(system or library_names(platform)[0])
    return found
