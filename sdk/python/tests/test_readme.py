"""The README's quickstart runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import Daemon

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart() -> str:
    text = README.read_text()
    section = text[text.index("## Quickstart"):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m is not None
    return m.group(1)


def test_quickstart_is_short() -> None:
    assert len(quickstart().strip().splitlines()) <= 15


def test_quickstart_runs_as_written(daemon: Daemon, tmp_path: Path) -> None:
    env = dict(os.environ, CORRAL_URL=daemon.url, CORRAL_TOKEN=daemon.token,
               PYTHONPATH=str(README.parent))
    r = subprocess.run([sys.executable, "-c", quickstart()], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "3 hello\ntick 1\ntick 2\ntick 3\nwritten from Python\n"
