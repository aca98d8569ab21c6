"""Commands: results, errors of each kind with their partial output, live
output, on the real daemon."""

from __future__ import annotations

import asyncio
import random
from typing import AsyncIterator

import pytest

import corral
from conftest import Daemon, delete_project_async, sleepers, unique, wait_until


def test_nonzero_exit_is_a_result(project: corral.Project) -> None:
    r = project.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.code, r.signal, r.oom_killed, r.ok) == (3, None, False, False)
    assert (r.stdout, r.stderr, r.stdout_bytes) == ("out\n", "err\n", b"out\n")


def test_signal_is_a_result(project: corral.Project) -> None:
    r = project.run(["sh", "-c", "echo before; kill -TERM $$"])
    assert (r.code, r.signal, r.stdout) == (None, "SIGTERM", "before\n")


def test_run_options(project: corral.Project) -> None:
    project.files.mkdir("sub")
    r = project.run(["sh", "-c", 'cat; printf "%s" "$GREETING"; pwd'], stdin=b"in\xff\n", env={"GREETING": "hi"},
                    cwd="/workspace/sub")
    assert r.stdout_bytes == b"in\xff\nhi/workspace/sub\n"
    assert r.stdout == "in\ufffd\nhi/workspace/sub\n"
    assert project.run(["id", "-u"], user="0").stdout == "0\n"


def test_timeout_with_partial_output(project: corral.Project) -> None:
    with pytest.raises(corral.Timeout) as e:
        project.run(["sh", "-c", "echo partial; echo half >&2; sleep 30"], timeout=1)
    assert (e.value.kind, e.value.stdout, e.value.stderr) == ("timeout", "partial\n", "half\n")


def test_overflow_with_partial_output(project: corral.Project) -> None:
    with pytest.raises(corral.Overflow) as e:
        project.run(["sh", "-c", "printf 0123456789abcdef; sleep 5"], limits=corral.OutputLimit(stdout=10))
    assert e.value.status in (None, 413)
    assert e.value.stdout_bytes == b"0123456789"


def test_start_error(project: corral.Project) -> None:
    with pytest.raises(corral.Start) as e:
        project.run(["/no/such/program"])
    assert (e.value.kind, e.value.reason, e.value.stdout) == ("start", "notFound", "")


def test_prepare_error(project: corral.Project) -> None:
    with pytest.raises(corral.Prepare) as e:
        project.run(["true"], env={"BAD NAME": "x"})
    assert e.value.status == 400


def test_callbacks_and_stream(project: corral.Project) -> None:
    seen = []
    r = project.run(["sh", "-c", "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c"],
                    on_stdout=lambda c: seen.append(("o", c.text)), on_stderr=lambda c: seen.append(("e", c.text)))
    assert [x for x in seen if x[0] == "o"] == [("o", "a\n"), ("o", "c\n")]
    assert [x for x in seen if x[0] == "e"] == [("e", "b\n")]
    assert r.stdout == "a\nc\n"
    s = project.stream(["sh", "-c", "echo x; exit 4"])
    assert [c.data for c in s] == [b"x\n"]
    assert s.result is not None and s.result.code == 4


WHOLE = {"stdout": ["a", "€b"], "stderr": ["x", "€y"]}


def by_stream(chunks: "list[tuple[str, str]]") -> "dict[str, list[str]]":
    out: "dict[str, list[str]]" = {}
    for stream, text in chunks:
        out.setdefault(stream, []).append(text)
    return out


@pytest.mark.parametrize("cut", [1, 2])
def test_utf8_character_split_between_chunks_arrives_whole(project: corral.Project, cut: int) -> None:
    # "€" is E2 82 AC. The command writes its first `cut` bytes, waits until
    # the test saw the chunk that ended there, then writes the rest: the
    # daemon sent a chunk cut inside the character, and the SDK held the cut
    # part back until the rest came.
    euro = "€".encode()
    first, rest = "".join(f"\\{b:03o}" for b in euro[:cut]), "".join(f"\\{b:03o}" for b in euro[cut:])

    def script(wait: str) -> str:
        return (f"printf 'a{first}'; {wait} go1; printf '{rest}b'; printf 'x{first}' >&2; {wait} go2; "
                f"printf '{rest}y' >&2")

    # A command: it waits for files the test writes.
    flag = "until [ -e /workspace/$1 ]; do sleep 0.01; done"
    stream = project.stream(["sh", "-c", f"w() {{ {flag}; }}; " + script("w")])
    chunks = []
    for c in stream:
        chunks.append(c)
        if c.data in (b"a", b"x"):
            project.files.write("go1" if c.data == b"a" else "go2", b"")
    # Strict decoding: no chunk ends inside a character. (The order of the
    # two streams' chunks between them is the daemon's.)
    assert by_stream([(c.stream, c.data.decode("utf-8")) for c in chunks]) == WHOLE
    # A session: it waits for lines on its stdin.
    with project.session(["sh", "-c", "w() { read _; }; " + script("w")]) as s:
        got = []
        for c in s:
            got.append((c.stream, c.data.decode("utf-8")))
            if c.data in (b"a", b"x"):
                s.write(b"go\n")
        assert by_stream(got) == WHOLE
        assert s.wait() == corral.ExitStatus(0, None)


def test_errors_of_the_api(daemon: Daemon, client: corral.Corral, other_client: corral.Corral,
                           project: corral.Project) -> None:
    with pytest.raises(corral.Unauthorized) as e:
        with corral.Corral(daemon.url, "corral_not-a-token") as bad:
            bad.projects.list()
    assert e.value.status == 401
    # Another account's project answers as one that does not exist.
    with pytest.raises(corral.Forbidden) as f:
        other_client.project(project.id).run(["true"])
    assert f.value.status == 403
    with pytest.raises(corral.Forbidden):
        other_client.projects.get(project.id)
    with pytest.raises(corral.NotFound):
        project.processes.get("proc_" + "0" * 32)
    with corral.Corral(daemon.url, daemon.admin_token) as admin:
        with pytest.raises(corral.NotFound):
            admin.project(999999).egress()
    with pytest.raises(corral.Invalid):
        project.files.stat("../etc")
    with pytest.raises(corral.Conflict):
        client.projects.create(project.info.name)


def test_rate_limited_carries_retry_after(project: corral.Project) -> None:
    procs = []
    try:
        with pytest.raises(corral.RateLimited) as e:
            for _ in range(40):  # 16 running processes per project
                procs.append(project.processes.start(["sleep", "120"]))
        assert e.value.status == 429 and e.value.kind == "busy"
        assert e.value.retry_after is not None and e.value.retry_after > 0
    finally:
        for p in procs:
            p.kill()


def test_project_settings(client: corral.Corral, other_client: corral.Corral) -> None:
    p = client.projects.create(unique("settings"))
    try:
        assert p.info.kind == "managed" and p.info.role == "owner"
        assert p.id in [i.id for i in client.projects.list()]
        m = p.set_machine(limits=corral.Limits(memory=256 << 20, pids=100))
        assert (m.limits.memory, m.limits.pids) == (256 << 20, 100)
        assert client.projects.get(p.id).info.machine.limits.pids == 100
        policy = p.set_egress(corral.EgressPolicy(mode="proxy", allow=["pypi.org"]))
        assert p.egress() == policy == corral.EgressPolicy("proxy", ["pypi.org"], [])
        assert p.egress_log() == []
        other = other_client.whoami()["name"]
        added = p.add_member(other)
        assert (added.account, added.role) == (other, "member")
        assert sorted(m.account for m in p.members()) == sorted([client.whoami()["name"], other])
        assert other_client.project(p.id).run(["echo", "member"]).stdout == "member\n"
        p.run(["sh", "-c", "echo x > /etc/changed"], user="0")
        p.reset()
        assert p.run(["cat", "/etc/changed"]).code != 0
    finally:
        p.delete()
    with pytest.raises(corral.Forbidden):
        client.projects.get(p.id)


def test_async_client_has_the_same_surface(daemon: Daemon) -> None:
    async def main() -> None:
        async with corral.AsyncCorral(daemon.url, daemon.token) as c:
            p = await c.projects.create(unique("async"))
            try:
                r = await p.run(["sh", "-c", "echo hi; exit 5"])
                assert (r.code, r.stdout) == (5, "hi\n")
                got = []

                async def on_out(ch: corral.Chunk) -> None:
                    got.append(ch.text)
                await p.run(["echo", "cb"], on_stdout=on_out)
                assert got == ["cb\n"]
                s = p.stream(["sh", "-c", "echo a; echo b >&2"])
                assert sorted([c.text async for c in s]) == ["a\n", "b\n"]
                with pytest.raises(corral.Timeout) as e:
                    await p.run(["sh", "-c", "echo p; sleep 10"], timeout=0.5)
                assert e.value.stdout == "p\n"
                await p.files.write("a.txt", "async")
                assert await p.files.read("a.txt") == b"async"

                async def parts() -> AsyncIterator[bytes]:
                    for i in range(8):
                        yield bytes(range(256)) * 512 * (i + 1)  # up to 1 MiB a part
                want = b"".join([bytes(range(256)) * 512 * (i + 1) for i in range(8)])
                assert (await p.files.write("b.bin", parts())).size == len(want)
                async with p.files.read_stream("b.bin") as r:
                    assert b"".join([b async for b in r]) == want
                proc = await p.processes.start(["sh", "-c", "echo bg"])
                assert b"".join([c.data async for c in proc.output()]) == b"bg\n"
            finally:
                await delete_project_async(p)
    asyncio.run(main())


def test_nothing_keeps_running_after_a_timeout_an_early_close_or_a_passed_deadline(project: corral.Project) -> None:
    # E2B #500: a timeout that raises while the process keeps running.
    def marker() -> str:
        return f"{random.randint(100000, 999999)}.25"

    m = marker()
    with pytest.raises(corral.Timeout) as e:
        project.run(["sh", "-c", f"sleep {m} & echo up; sleep {m}"], timeout=1)
    assert e.value.stdout == "up\n"
    assert sleepers(m) == []  # the daemon answers once they are gone

    m = marker()
    s = project.stream(["sh", "-c", f"echo up; sleep {m}"], timeout=60)
    assert next(s).data == b"up\n"
    wait_until(lambda: len(sleepers(m)) == 1, "the command started")
    s.close()  # the daemon sees its client go and cancels the command
    wait_until(lambda: sleepers(m) == [], "an abandoned command ended")

    m = marker()
    started = []
    with pytest.raises(corral.DeadlineExceeded):
        project.run(["sh", "-c", f"echo up; sleep {m}"], timeout=60, deadline=1.5, on_stdout=started.append)
    assert [c.data for c in started] == [b"up\n"]
    wait_until(lambda: sleepers(m) == [], "a command past its client's deadline ended")


def test_images_are_the_administrators(daemon: Daemon, client: corral.Corral) -> None:
    """listImages and pullImage: refused to an ordinary account; an
    administrator lists the store, and a pull from a registry that does not
    answer (loopback port 1) is BadGateway and records nothing."""
    with pytest.raises(corral.Forbidden):
        client.images()
    with pytest.raises(corral.Forbidden):
        client.pull_image("127.0.0.1:1/nothing:latest")
    with corral.Corral(daemon.url, daemon.admin_token) as admin:
        before = [i["name"] for i in admin.images()]
        with pytest.raises(corral.BadGateway):
            admin.pull_image("127.0.0.1:1/nothing:latest", name="nothing")
        with pytest.raises(corral.Invalid):
            admin.pull_image("127.0.0.1:1/nothing:latest", name="Not A Name")
        assert [i["name"] for i in admin.images()] == before
