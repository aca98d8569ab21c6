"""Nothing hangs when the daemon is gone: each test starts a daemon of its
own (sdk/testdaemon), then kills, stops or pauses it, or its worker."""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Iterator

import pytest

import corral
from conftest import Daemon, new_daemon

DEADLINE = 4.0


@pytest.fixture
def own_daemon(daemon: Daemon) -> Iterator[Daemon]:
    d = new_daemon()
    d.start(daemon.binary)
    try:
        yield d
    finally:
        try:
            os.kill(d.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        d.stop()
        shutil.rmtree(d.state, ignore_errors=True)


def test_daemon_killed_mid_call_is_transport_within_the_deadline(own_daemon: Daemon) -> None:
    with corral.Corral(own_daemon.url, own_daemon.token, deadline=DEADLINE) as c:
        p = c.projects.create("gone")
        running = iter(p.stream(["sh", "-c", "echo started; sleep 120"], timeout=300))
        assert next(running).data == b"started\n"
        proc = p.processes.start(["sh", "-c", "echo up; sleep 600"])
        out = proc.output(follow=True)
        assert next(out).data == b"up\n"
        term = p.terminal(["sh"])
        term.write("echo ready\n")
        term.expect("ready\r\n")
        watch = p.files.watch()

        os.kill(own_daemon.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(corral.Transport) as e:
            next(running)
        assert e.value.status is None
        with pytest.raises(corral.Transport):
            next(out)
        with pytest.raises(corral.Transport):
            term.wait()
        with pytest.raises(corral.Transport):
            next(iter(watch))
        with pytest.raises(corral.Transport):
            c.whoami()
        with pytest.raises(corral.Transport):
            p.run(["true"])
        assert time.monotonic() - t0 < DEADLINE


def test_daemon_that_stopped_answering_fails_calls_within_the_deadline(own_daemon: Daemon) -> None:
    with corral.Corral(own_daemon.url, own_daemon.token, deadline=DEADLINE) as c:
        p = c.projects.create("paused")
        proc = p.processes.start(["sh", "-c", "echo up; sleep 600"])
        out = proc.output(follow=True)
        assert next(out).data == b"up\n"
        watch = iter(p.files.watch())
        term = p.terminal(["sh"])
        os.kill(own_daemon.pid, signal.SIGSTOP)
        try:
            for call in (c.whoami, lambda: next(out), lambda: next(watch), term.wait):
                t0 = time.monotonic()
                with pytest.raises(corral.Transport):
                    call()
                took = time.monotonic() - t0
                assert took < DEADLINE + 1, took
            t0 = time.monotonic()
            with pytest.raises(corral.DeadlineExceeded):
                p.run(["true"], timeout=1)  # waits its timeout plus the deadline
            assert 1 + DEADLINE - 0.5 < time.monotonic() - t0 < 1 + DEADLINE + 1
        finally:
            os.kill(own_daemon.pid, signal.SIGCONT)
        # The daemon answers again; the process ran on.
        assert p.processes.get(proc.id).info.state == "running"


def test_worker_killed_mid_command_is_transport_with_partial_output(own_daemon: Daemon) -> None:
    with corral.Corral(own_daemon.url, own_daemon.token, deadline=DEADLINE) as c:
        p = c.projects.create("worker")
        s = p.stream(["sh", "-c", "echo partial; echo half >&2; sleep 120"], timeout=300)
        it = iter(s)
        got = next(it)
        os.kill(own_daemon.worker_pid(), signal.SIGKILL)
        with pytest.raises(corral.Transport) as e:
            for c2 in it:
                got = c2
        assert (e.value.kind, e.value.stdout, e.value.stderr) == ("transport", "partial\n", "half\n"), e.value


def test_daemon_shutting_down_aborts_sessions(own_daemon: Daemon) -> None:
    with corral.Corral(own_daemon.url, own_daemon.token, deadline=DEADLINE) as c:
        p = c.projects.create("shutdown")
        with p.session(["sh", "-c", "echo in; sleep 600"]) as s:
            first = s.read()
            if first is None:
                s.wait()  # raises why it ended
            assert first is not None and first.data == b"in\n"
            os.kill(own_daemon.pid, signal.SIGTERM)
            with pytest.raises(corral.Abort) as e:
                s.wait()
            assert e.value.kind == "abort"
