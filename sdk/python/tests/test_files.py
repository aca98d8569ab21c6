"""Files: every byte value round-trips, streams, the tree operations, and a
watch's events in order."""

from __future__ import annotations

import asyncio
import io
from typing import List

import pytest

import corral
from conftest import Daemon, delete_project_async, unique


def test_all_256_byte_values_round_trip(project: corral.Project) -> None:
    data = bytes(range(256)) * 4
    info = project.files.write("bytes.bin", data, mode=0o640)
    assert (info.size, info.mode, info.type, info.path) == (1024, 0o640, "file", "/workspace/bytes.bin")
    assert project.files.read("bytes.bin") == data
    assert project.files.read("/workspace/bytes.bin") == data
    # The machine sees the same bytes.
    r = project.run(["od", "-An", "-tx1", "-v", "bytes.bin"])
    assert bytes.fromhex(r.stdout.replace("\n", "").replace(" ", "")) == data


def test_streams(project: corral.Project) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB
    parts = [big[i:i + 100_000] for i in range(0, len(big), 100_000)]
    assert project.files.write("big.bin", iter(parts)).size == len(big)
    assert project.files.write("file.bin", io.BytesIO(big)).size == len(big)
    with project.files.read_stream("big.bin") as r:
        assert r.size == len(big) and r.mode == 0o644
        got = b"".join(r)
    assert got == big
    assert project.files.read("file.bin") == big


def test_tree_operations(project: corral.Project) -> None:
    f = project.files
    d = f.mkdir("a/b/c", parents=True, mode=0o750)
    assert (d.type, d.mode, d.path) == ("dir", 0o750, "/workspace/a/b/c")
    f.write("a/b/c/x.txt", "x")
    with pytest.raises(corral.NotFound):
        f.write("new/dir/y.txt", "y")
    assert f.write("new/dir/y.txt", "y", parents=True).path == "/workspace/new/dir/y.txt"
    f.remove("new", recursive=True)
    f.rename("a/b/c/x.txt", "a/y.txt")
    assert f.stat("a/y.txt").size == 1
    with pytest.raises(corral.NotFound):
        f.stat("a/b/c/x.txt")
    listing = f.list("a", depth=3)
    assert [e.path for e in listing.entries] == ["/workspace/a/b", "/workspace/a/b/c", "/workspace/a/y.txt"]
    assert not listing.truncated and listing.dir.path == "/workspace/a"
    with pytest.raises(corral.Conflict):
        f.remove("a")
    f.remove("a", recursive=True)
    with pytest.raises(corral.NotFound):
        f.read("a/y.txt")


def test_watch_reports_create_modify_delete_in_order(daemon: Daemon) -> None:
    async def main() -> List[corral.FileEvent]:
        async with corral.AsyncCorral(daemon.url, daemon.token) as c:
            p = await c.projects.create(unique("watch"))
            try:
                await p.files.mkdir("w")
                events: List[corral.FileEvent] = []
                async with await p.files.watch("w") as watch:
                    await p.run(["sh", "-c", "echo one > w/f; echo two >> w/f; mkdir w/d; rm w/f; rmdir w/d"])

                    async def collect() -> None:
                        async for ev in watch:
                            events.append(ev)
                            if ev.path == "/workspace/w/d" and ev.type == "delete":
                                return
                    await asyncio.wait_for(collect(), 20)
                return events
            finally:
                await delete_project_async(p)

    events = asyncio.run(main())
    seen = [(e.type, e.path, e.is_dir) for e in events]
    # Consecutive modifies of one file may come as one or several.
    compact = [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1] or s[0] != "modify"]
    assert compact == [
        ("create", "/workspace/w/f", False),
        ("modify", "/workspace/w/f", False),
        ("create", "/workspace/w/d", True),
        ("delete", "/workspace/w/f", False),
        ("delete", "/workspace/w/d", True),
    ], seen
