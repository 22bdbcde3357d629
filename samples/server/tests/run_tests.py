"""Runs the server's pytest file; exits 77 (ctest: skipped) when pytest or openai is missing."""
import importlib.util
import sys

missing = [m for m in ("openai", "pytest") if importlib.util.find_spec(m) is None]
if missing:
    print(f"server_openai_test: skipped: no Python module {', '.join(missing)} "
          "(scripts/install_deps.sh installs them)")
    sys.exit(77)

import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--durations=5", *sys.argv[1:]]))
