"""Bundles a built libkiln into the package when one is found at install time, so an installed
`kiln` works without KILN_LIBRARY: the file KILN_LIBRARY names, else the release build tree of the
repository this directory lies in (build/lib/c_api). Without either, the package installs without
the library and finds it at import time (KILN_LIBRARY, or the system's loader path)."""

import os
import shutil
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
    tree = Path(__file__).resolve().parent.parent.parent / "build" / "lib" / "c_api" / SONAME
    return tree if tree.is_file() else None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = built_library()
        if library is not None:
            target = Path(self.build_lib) / "kiln" / SONAME
            # Follow symlinks: the wheel holds the real file under the SONAME the loader expects.
            shutil.copyfile(os.path.realpath(library), target)
            print(f"kiln: bundling {library}")


setup(cmdclass={"build_py": BuildPyWithLibrary})
