import assert from "node:assert/strict";
import { before, test } from "node:test";

import { ConflictError, NotFoundError } from "../dist/index.js";
import { client, collect, eventually, hostProcesses, newProject } from "./helpers.mjs";

let corral, project;
before(async () => {
  corral = await client();
  project = await newProject(corral);
});

test("a background process's output is replayed from an offset after the client reconnects", async () => {
  const p = await project.processes.start(["sh", "-c", "for i in 1 2 3 4 5 6; do echo line $i; echo err $i >&2; sleep 0.2; done"]);
  assert.match(p.id, /^proc_[0-9a-f]{32}$/);
  // Read the first chunks, then go away (the request closes).
  let next = 0;
  let first = "";
  for await (const c of p.output()) {
    assert.equal(c.offset, next, "offsets are contiguous");
    next = c.offset + c.data.length;
    first += c.text;
    if (first.includes("line 2")) break;
  }
  // Back from where we left: the rest, and nothing twice.
  const rest = p.output({ since: next });
  const got = await collect(rest);
  const all = first + got.text;
  for (let i = 1; i <= 6; i++) {
    assert.equal(all.split(`line ${i}\n`).length, 2, `line ${i} once in ${JSON.stringify(all)}`);
    assert.equal(all.split(`err ${i}\n`).length, 2, `err ${i} once`);
  }
  assert.equal(rest.end.state, "exited");
  assert.deepEqual(rest.end.exit, { code: 0, signal: null });
  assert.equal(rest.end.offset, Buffer.byteLength(all));
  // A replay from an offset in the middle, without following.
  const mid = p.output({ since: 7, follow: false });
  const again = await collect(mid);
  assert.equal(Buffer.concat([Buffer.from(all).subarray(0, 7), again.bytes]).toString(), all);
  assert.equal((await p.refresh()).state, "exited");
  const listed = await project.processes.list();
  assert.ok(listed.some((x) => x.id === p.id));
  assert.equal((await project.processes.get(p.id)).info.state, "exited");
  await assert.rejects(p.signal("TERM"), ConflictError);
});

test("killing a background process kills its whole tree", async () => {
  const mark = `${Math.floor(Math.random() * 1e6) + 1000000}`;
  const p = await project.processes.start(["sh", "-c", `sleep ${mark} & (setsid sleep ${mark} &); sleep ${mark}`]);
  assert.ok(await eventually(() => hostProcesses(`sleep ${mark}`).length === 3), `three sleeps: ${hostProcesses(`sleep ${mark}`)}`);
  const last = await p.kill();
  assert.equal(last.state, "killed");
  assert.deepEqual(hostProcesses(`sleep ${mark}`), []);
  await assert.rejects(p.refresh(), NotFoundError);
});

test("a signal reaches every process of the tree", async () => {
  const mark = `${Math.floor(Math.random() * 1e6) + 2000000}`;
  const p = await project.processes.start(["sh", "-c", `trap 'echo got TERM; exit 7' TERM; sleep ${mark} & wait`]);
  assert.ok(await eventually(() => hostProcesses(`sleep ${mark}`).length === 1));
  await p.signal("TERM");
  const end = await p.wait();
  assert.equal(end.state, "exited");
  assert.ok(await eventually(() => hostProcesses(`sleep ${mark}`).length === 0), "the sleep got TERM too");
});

test("a process on a terminal", async () => {
  const p = await project.processes.start(["sh", "-c", "stty size"], { tty: { rows: 33, cols: 77 } });
  const got = await collect(p.output());
  assert.equal(got.text.trim(), "33 77");
});
