"""Terminals and sessions."""

from __future__ import annotations

import pytest

import corral


def test_pty_echoes_and_resizes(project: corral.Project) -> None:
    with project.terminal(["sh"], rows=30, cols=100) as t:
        assert t.tty
        # The terminal echoes what is typed; the shell runs it.
        t.write("echo he''llo\n")
        assert t.expect("echo he''llo").endswith(b"echo he''llo")
        # Its output, on a line of its own (after the shell's prompt, "$ ",
        # which it prints when it likes).
        assert t.expect("hello\r\n").replace(b"$ ", b"") == b"\r\nhello\r\n"
        t.write("stty size\n")
        assert t.expect("30 100\r\n").replace(b"$ ", b"").endswith(b"stty size\r\n30 100\r\n")
        t.resize(40, 120)
        t.write("stty size\n")
        assert t.expect("40 120\r\n").replace(b"$ ", b"").endswith(b"stty size\r\n40 120\r\n")
        t.write("exit 7\n")
        assert t.wait() == corral.ExitStatus(7, None)


def test_session_stdin_and_exit(project: corral.Project) -> None:
    with project.session(["sh", "-c", "cat; echo done >&2; exit 4"]) as s:
        s.write(b"in\xff")
        s.close_stdin()
        got = list(s)
        assert b"".join(c.data for c in got if c.stream == "stdout") == b"in\xff"
        assert b"".join(c.data for c in got if c.stream == "stderr") == b"done\n"
        assert s.wait() == corral.ExitStatus(4, None)
        assert s.lease_id


def test_session_that_cannot_start(project: corral.Project) -> None:
    with project.session(["/no/such/program"]) as s:
        with pytest.raises(corral.Start):
            s.wait()
