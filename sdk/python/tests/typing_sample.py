"""Checked by mypy (test_types.py), never run: both faces are typed alike."""

from typing import List, Optional

from typing_extensions import assert_type

import corral


def sync_face(c: corral.Corral) -> None:
    p = c.projects.create("x")
    assert_type(p, corral.Project)
    assert_type(c.project(1), corral.Project)
    assert_type(p.info, Optional[corral.ProjectInfo])
    assert_type(c.projects.list(), List[corral.ProjectInfo])
    r = p.run(["true"], timeout=1.5)
    assert_type(r, corral.CommandResult)
    assert_type(r.stdout_bytes, bytes)
    s = p.stream(["true"])
    assert_type(s, corral.CommandStream)
    for chunk in s:
        assert_type(chunk, corral.Chunk)
    assert_type(s.result, Optional[corral.CommandResult])
    proc = p.processes.start(["sleep", "1"])
    assert_type(proc, corral.Process)
    out = proc.output(since=3)
    assert_type(next(out), corral.Chunk)
    assert_type(out.end, Optional[corral.OutputEnd])
    assert_type(proc.kill(), corral.ProcessInfo)
    assert_type(p.files.write("f", b""), corral.FileInfo)
    assert_type(p.files.read("f"), bytes)
    with p.files.read_stream("f") as reader:
        assert_type(reader, corral.FileReader)
        assert_type(next(reader), bytes)
    w = p.files.watch()
    assert_type(next(w), corral.FileEvent)
    t = p.terminal(rows=3)
    assert_type(t, corral.Session)
    assert_type(t.read(), Optional[corral.Chunk])
    assert_type(t.wait(), corral.ExitStatus)
    assert_type(p.lsp("gopls"), corral.Messages)


async def async_face(c: corral.AsyncCorral) -> None:
    p = await c.projects.create("x")
    assert_type(p, corral.AsyncProject)
    r = await p.run(["true"])
    assert_type(r, corral.CommandResult)
    async for chunk in p.stream(["true"]):
        assert_type(chunk, corral.Chunk)
    proc = await p.processes.start(["true"])
    async for chunk in proc.output():
        assert_type(chunk.offset, Optional[int])
    async for ev in await p.files.watch():
        assert_type(ev, corral.FileEvent)
    t = await p.terminal()
    assert_type(await t.wait(), corral.ExitStatus)
