"""Background processes: output from an offset after reconnecting, signals,
killing the whole tree."""

from __future__ import annotations

import random
import time
import corral
from conftest import Daemon, sleepers


def test_output_replayed_from_an_offset_after_reconnecting(daemon: Daemon, project: corral.Project) -> None:
    script = "for i in $(seq 1 30); do echo line$i; echo err$i >&2; sleep 0.05; done"
    proc = project.processes.start(["sh", "-c", script])
    first = b""
    next_offset = 0
    # A first client reads part of it, following, then goes away.
    with corral.Corral(daemon.url, daemon.token) as c1:
        out = c1.project(project.id).processes.get(proc.id).output(0, follow=True)
        for chunk in out:
            assert chunk.offset == next_offset
            first += chunk.data
            next_offset = chunk.offset + len(chunk.data)
            if next_offset >= 100:
                break
        out.close()
    assert 100 <= next_offset < 30 * 12
    # Another client continues from the offset it reached.
    rest = b""
    with corral.Corral(daemon.url, daemon.token) as c2:
        out = c2.project(project.id).processes.get(proc.id).output(next_offset)
        for chunk in out:
            assert chunk.offset == next_offset
            rest += chunk.data
            next_offset += len(chunk.data)
        assert out.end is not None and out.end.offset == next_offset
        assert out.end.state == "exited" and out.end.exit == corral.ExitStatus(0, None)
    # Both parts are the whole output: what a reader from 0 gets at once.
    whole = project.processes.get(proc.id).output(0, follow=False)
    chunks = list(whole)
    assert first + rest == b"".join(c.data for c in chunks)
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == "".join(
        f"line{i}\n" for i in range(1, 31)).encode()
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == "".join(
        f"err{i}\n" for i in range(1, 31)).encode()


def test_list_get_signal(project: corral.Project) -> None:
    proc = project.processes.start(["sh", "-c", "trap 'echo got TERM; exit 9' TERM; echo ready; "
                                          "while :; do sleep 0.1; done"])
    assert proc.info.state == "running" and proc.id.startswith("proc_")
    assert proc.id in [p.id for p in project.processes.list()]
    out = proc.output()
    assert next(out).data == b"ready\n"
    proc.signal("TERM")
    # (Its sleep got it too: the shell may report that.)
    assert b"got TERM\n" in b"".join(c.data for c in out)
    info = proc.refresh()
    assert (info.state, info.exit) == ("exited", corral.ExitStatus(9, None))
    try:
        proc.signal("TERM")
        raise AssertionError("an ended process took a signal")
    except corral.Conflict:
        pass


def test_killed_process_tree_leaves_nothing_running(project: corral.Project) -> None:
    marker = f"{random.randint(100000, 999999)}.5"
    # Three descendants, one in a session of its own, one double-forked.
    script = (f"sleep {marker} & setsid sleep {marker} & (sleep {marker} &) ; "
              "echo started; wait")
    proc = project.processes.start(["sh", "-c", script])
    out = proc.output()
    assert next(out).data == b"started\n"
    out.close()
    deadline = time.monotonic() + 10
    while len(sleepers(marker)) < 3:
        assert time.monotonic() < deadline, "the tree did not start"
        time.sleep(0.05)
    info = proc.kill()
    assert info.state == "killed" and info.error is not None and info.error["kind"] == "abort"
    # kill answers once the tree ended.
    assert sleepers(marker) == []
    try:
        project.processes.get(proc.id)
        raise AssertionError("a killed process is still known")
    except corral.NotFound:
        pass


def test_process_with_terminal_and_wait(project: corral.Project) -> None:
    proc = project.processes.start(["sh", "-c", "stty size; exit 2"], tty=(33, 77))
    info = proc.wait()
    assert info.state == "exited" and info.exit == corral.ExitStatus(2, None)
    assert b"".join(c.data for c in proc.output(follow=False)).strip() == b"33 77"


def test_output_that_fell_off_the_ring_is_counted_not_hidden(project: corral.Project) -> None:
    proc = project.processes.start(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x; echo END"],
                                   output_buffer=1024)
    info = proc.wait()
    assert info.output_end == 5004 and info.output_start == 5004 - 1024
    out = proc.output(0)
    data = b"".join(c.data for c in out)
    assert data == b"x" * 1020 + b"END\n"
    assert out.skipped == 5004 - 1024 and out.end is not None and out.end.offset == 5004
    # From an offset still there, nothing is skipped.
    tail = proc.output(5000, follow=False)
    assert b"".join(c.data for c in tail) == b"END\n" and tail.skipped == 0
