"""The suite runs against a real daemon and worker that it starts itself
(sdk/testdaemon/start) on a temporary state directory, as root."""

from __future__ import annotations

import asyncio
import os
import time
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest

import corral

TESTDAEMON = Path(__file__).resolve().parents[2] / "testdaemon"


class Daemon:
    """A daemon started by sdk/testdaemon/start on a state directory of its own."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.env: Dict[str, str] = {}

    def start(self, binary: str = "") -> None:
        """Starts it, with the corral at ``binary`` if given (else built)."""
        env = dict(os.environ, CORRAL_TESTDAEMON_BIN=binary) if binary else None
        out = subprocess.run([str(TESTDAEMON / "start"), self.state], capture_output=True, text=True,
                             timeout=600, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"sdk/testdaemon/start {self.state} exited {out.returncode}:\n{out.stderr}")
        self.env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)

    def stop(self) -> None:
        subprocess.run([str(TESTDAEMON / "stop"), self.state], check=True, timeout=120)

    @property
    def url(self) -> str:
        return self.env["CORRAL_URL"]

    @property
    def token(self) -> str:
        return self.env["CORRAL_TOKEN"]

    @property
    def admin_token(self) -> str:
        return self.env["CORRAL_ADMIN_TOKEN"]

    @property
    def binary(self) -> str:
        return os.path.join(self.state, "corral")

    @property
    def pid(self) -> int:
        return int(self.env["CORRAL_PID"])

    def worker_pid(self) -> int:
        """The daemon's supervised worker."""
        want = f" --socket {self.state}/worker.sock "
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if want in cmd + " ":
                    return int(d.name)
        raise LookupError("no worker")


def sleepers(marker: str) -> List[int]:
    """The host's processes running `sleep MARKER` (machines' included)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes() == b"sleep\0" + marker.encode() + b"\0":
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Waits for cond to hold (polling), failing after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.02)


def new_daemon() -> Daemon:
    # Short: the socket's path must fit a sockaddr_un.
    return Daemon(tempfile.mkdtemp(prefix="corral-sdkpy-", dir="/tmp"))


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("the daemon's worker needs root (CI runs as root)")
    d = new_daemon()
    d.start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(d.state, ignore_errors=True)


@pytest.fixture(scope="session")
def client(daemon: Daemon) -> Iterator[corral.Corral]:
    with corral.Corral(daemon.url, daemon.token) as c:
        yield c


@pytest.fixture(scope="session")
def other_client(daemon: Daemon) -> Iterator[corral.Corral]:
    """A client of a second account, made over HTTP with the admin's token."""
    with corral.Corral(daemon.url, daemon.admin_token) as admin:
        admin.create_account("other")
        tok = admin.create_token("other", "sdkpy")["token"]
    with corral.Corral(daemon.url, tok) as c:
        yield c


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def delete_project(p: corral.Project) -> None:
    """Deletes p once the leases of its closed sessions and watches are
    released (the daemon releases them just after the socket closed)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            p.delete()
            return
        except corral.Conflict:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def delete_project_async(p: corral.AsyncProject) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            await p.delete()
            return
        except corral.Conflict:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


@pytest.fixture
def project(client: corral.Corral) -> Iterator[corral.Project]:
    """A new managed project, deleted (its processes killed) afterwards."""
    p = client.projects.create(unique("t"))
    yield p
    for proc in p.processes.list():
        if proc.running:
            p.processes.get(proc.id).kill()
    delete_project(p)
