"""The package type-checks (mypy --strict, Python 3.9), and so does code
using either face of it (typing_sample.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_mypy() -> None:
    # Its cache lives with the Go tests' (47 s on a cold cache, 2 s warm).
    cache = os.path.join(os.environ.get("CORRAL_TEST_CACHE", "/var/tmp/corral-test-cache"), "mypy")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-warn-return-any", "--python-version", "3.9",
                        "--cache-dir", cache, "corral", str(HERE / "typing_sample.py")],
                       cwd=HERE.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
