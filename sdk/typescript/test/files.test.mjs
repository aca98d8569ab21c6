import assert from "node:assert/strict";
import { before, test } from "node:test";

import { ConflictError, InvalidError, NotFoundError, readAll } from "../dist/index.js";
import { client, newProject } from "./helpers.mjs";

let corral, project;
before(async () => {
  corral = await client();
  project = await newProject(corral);
});

// Every byte value, each followed by its complement, twice.
const all = new Uint8Array(1024);
for (let i = 0; i < 512; i++) all[i] = i % 2 === 0 ? i >> 1 : 255 - (i >> 1);
all.set(all.subarray(0, 512), 512);

test("files round-trip all 256 byte values", async () => {
  const info = await project.files.write("bytes.bin", all, { mode: 0o600 });
  assert.equal(info.size, all.length);
  assert.equal(info.mode, "0600");
  assert.equal(info.path, "/workspace/bytes.bin");
  assert.deepEqual(await project.files.read("/workspace/bytes.bin"), all);
  // The command sees the same bytes.
  const r = await project.run(["od", "-An", "-tx1", "-v", "bytes.bin"]);
  assert.equal(r.stdoutText.replace(/\s+/g, ""), Buffer.from(all).toString("hex"));
});

test("files stream both ways", async () => {
  // Written from an async iterable of chunks, 64 KiB of each value.
  async function* chunks() {
    for (let v = 0; v < 256; v++) yield new Uint8Array(64 << 10).fill(v);
  }
  const info = await project.files.write("big.bin", chunks());
  assert.equal(info.size, 256 * (64 << 10));
  const f = await project.files.readStream("big.bin");
  assert.equal(f.size, 256 * (64 << 10));
  assert.equal(f.mode, "0644");
  const got = await readAll(f.stream);
  assert.equal(got.length, f.size);
  for (let v = 0; v < 256; v++) assert.equal(got[v * (64 << 10) + 1234], v);
  // And from a ReadableStream.
  await project.files.write("copy.bin", (await project.files.readStream("bytes.bin")).stream);
  assert.deepEqual(await project.files.read("copy.bin"), all);
});

test("stat, list, mkdir, rename and remove", async () => {
  await project.files.mkdir("d/e/f", { parents: true, mode: 0o750 });
  await assert.rejects(project.files.mkdir("d"), ConflictError);
  await project.files.write("d/e/a.txt", "a");
  await project.files.write("d/e/b.txt", "bb");
  const st = await project.files.stat("d/e");
  assert.equal(st.type, "dir");
  const l = await project.files.list("d", { depth: 3 });
  assert.equal(l.dir.path, "/workspace/d");
  assert.deepEqual(
    l.entries.map((e) => [e.path, e.type]),
    [
      ["/workspace/d/e", "dir"],
      ["/workspace/d/e/a.txt", "file"],
      ["/workspace/d/e/b.txt", "file"],
      ["/workspace/d/e/f", "dir"],
    ],
  );
  assert.equal(l.truncated, false);
  assert.equal((await project.files.list("d", { depth: 3, limit: 1 })).truncated, true);
  await assert.rejects(project.files.write("d/new/deep/c.txt", "c"), NotFoundError);
  assert.equal((await project.files.write("d/new/deep/c.txt", "c", { mkdirs: true })).size, 1);
  await project.files.remove("d/new", { recursive: true });
  await project.files.rename("d/e/a.txt", "d/e/b.txt");
  assert.equal(await project.files.readText("d/e/b.txt"), "a");
  await assert.rejects(project.files.stat("d/e/a.txt"), NotFoundError);
  await assert.rejects(project.files.remove("d"), ConflictError);
  await project.files.remove("d", { recursive: true });
  await assert.rejects(project.files.read("d/e/b.txt"), NotFoundError);
  await assert.rejects(project.files.read("../etc/passwd"), InvalidError);
});

test("watch reports create, modify and delete in order", async () => {
  await project.files.mkdir("w");
  const watch = await project.files.watch("w");
  // Events of one kind on one file in a row may merge (inotify): each is
  // followed by another.
  const r = await project.run(["sh", "-c", "echo one > w/f; mkdir w/sub; echo two >> w/f; touch w/g; rm w/f; touch w/done"]);
  assert.equal(r.code, 0);
  const seen = [];
  for await (const ev of watch) {
    seen.push([ev.type, ev.path.replace("/workspace/w/", ""), !!ev.isDir]);
    if (ev.path === "/workspace/w/done") break;
  }
  assert.deepEqual(seen, [
    ["create", "f", false],
    ["modify", "f", false],
    ["create", "sub", true],
    ["modify", "f", false],
    ["create", "g", false],
    ["delete", "f", false],
    ["create", "done", false],
  ]);
});

test("a PUT shows in a watch as its temporary file renamed onto the target", async () => {
  await project.files.mkdir("w2");
  const watch = await project.files.watch("/workspace/w2", { recursive: true });
  await project.files.write("w2/x", "x");
  for await (const ev of watch) {
    if (ev.type === "rename") {
      assert.equal(ev.path, "/workspace/w2/x");
      assert.match(ev.from, /^\/workspace\/w2\/\.corral-put-/);
      break;
    }
  }
  watch.close();
});
