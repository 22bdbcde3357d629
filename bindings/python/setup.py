"""Bundles a built libkiln into the package when one is found at install time, so an installed
`kiln` works without KILN_LIBRARY: the file KILN_LIBRARY names, else the release build tree of the
repository this directory lies in (build/lib/c_api; kiln.dll on Windows, with the mingw runtime
DLL beside it). Without either, the package installs without
the library and finds it at import time (KILN_LIBRARY, or the system's loader path)."""

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SONAME = "libkiln.so.1"


def built_library():
    env = os.environ.get("KILN_LIBRARY")
    if env:
        if not Path(env).is_file():
            raise SystemExit(f"KILN_LIBRARY={env} is not a file")
        return Path(env)
    name = "kiln.dll" if sys.platform == "win32" else SONAME
    tree = Path(__file__).resolve().parent.parent.parent / "build" / "lib" / "c_api" / name
    return tree if tree.is_file() else None


# kiln.dll (the Windows build) needs one DLL of the mingw runtime, bundled beside it when found
# beside it (scripts/test_windows.sh puts it there).
WINDOWS_RUNTIME = "libwinpthread-1.dll"


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = built_library()
        if library is None:
            return
        package = Path(self.build_lib) / "kiln"
        if library.suffix.lower() == ".dll":
            shutil.copyfile(library, package / "kiln.dll")
            runtime = library.parent / WINDOWS_RUNTIME
            if runtime.is_file():
                shutil.copyfile(runtime, package / WINDOWS_RUNTIME)
        else:
            # Follow symlinks: the wheel holds the real file under the SONAME the loader expects.
            shutil.copyfile(os.path.realpath(library), package / SONAME)
        print(f"kiln: bundling {library}")


setup(cmdclass={"build_py": BuildPyWithLibrary})
