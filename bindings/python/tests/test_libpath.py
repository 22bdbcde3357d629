"""Where `import kiln` looks for libkiln (kiln/_libpath.py), on Linux and on Windows.

The Windows lookup is checked here from Linux (no Windows Python runs in the test command): the
paths it lists for a checkout laid out as the builds lay it out. scripts/test_windows.sh checks
that the first of them is the kiln.dll its cross build made."""

from pathlib import Path

from kiln import _libpath


def checkout(tmp_path: Path, files: list[str]) -> Path:
    """A checkout with `files` (relative paths) in it; returns its package folder."""
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    package = tmp_path / "bindings" / "python" / "kiln"
    package.mkdir(parents=True, exist_ok=True)
    return package


BOTH_BUILDS = [
    "bindings/python/kiln/libkiln.so.1",
    "bindings/python/kiln/kiln.dll",
    "build/lib/c_api/libkiln.so.1",
    "build-windows/bin/kiln.dll",
]


def test_kiln_library_is_the_only_candidate(tmp_path):
    package = checkout(tmp_path, BOTH_BUILDS)
    for platform in ("win32", "linux"):
        env = {"KILN_LIBRARY": "/somewhere/kiln.dll"}
        assert _libpath.candidates(platform, env, package) == ["/somewhere/kiln.dll"]


def test_windows_takes_the_dll_bundled_then_built(tmp_path):
    package = checkout(tmp_path, BOTH_BUILDS)
    found = _libpath.candidates("win32", {}, package)
    assert found == [str(package / "kiln.dll"), str(tmp_path / "build-windows" / "bin" / "kiln.dll"),
                     "kiln.dll"]


def test_windows_takes_a_native_build_tree_first(tmp_path):
    package = checkout(tmp_path, ["build/lib/c_api/kiln.dll", "build-windows/bin/kiln.dll"])
    found = _libpath.candidates("win32", {}, package)
    assert found[:2] == [str(tmp_path / "build/lib/c_api/kiln.dll"),
                         str(tmp_path / "build-windows/bin/kiln.dll")]


def test_windows_never_takes_the_linux_library(tmp_path):
    package = checkout(tmp_path, BOTH_BUILDS[0:1] + BOTH_BUILDS[2:3])
    # Nothing for Windows in the checkout: only the loader's search (PATH) is left.
    assert _libpath.candidates("win32", {}, package) == ["kiln.dll"]


def test_linux_takes_the_shared_object_bundled_then_built(tmp_path):
    package = checkout(tmp_path, BOTH_BUILDS)
    found = _libpath.candidates("linux", {}, package)
    assert found[:2] == [str(package / "libkiln.so.1"), str(tmp_path / "build/lib/c_api/libkiln.so.1")]
    assert not any(path.endswith(".dll") for path in found)
