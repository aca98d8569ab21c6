import assert from "node:assert/strict";
import { before, test } from "node:test";

import { StartError } from "../dist/index.js";
import { client, newProject } from "./helpers.mjs";

let corral, project;
before(async () => {
  corral = await client();
  project = await newProject(corral);
});

/** Reads the session's output until it matches `re`; answers all of it. */
async function until(s, re) {
  let out = "";
  while (!re.test(out)) {
    const c = await s.read();
    assert.ok(c, `the session ended before ${re}: ${JSON.stringify(out)}`);
    assert.equal(c.stream, "stdout", "a terminal's output is all stdout");
    out += c.text;
  }
  return out;
}

test("a PTY echoes what is typed and resizes", async () => {
  const t = await project.terminal({ rows: 30, cols: 100 });
  assert.ok(t.leaseId);
  // The keystrokes are echoed (the shell's prompt may come before or after
  // the echo), then the command answers.
  t.write("stty size\n");
  let out = await until(t, /30 100\r?\n/);
  assert.match(out, /stty size\r?\n/);
  t.resize(40, 120);
  t.write("echo hel''lo; stty size\n");
  out = await until(t, /hello\r?\n(\$ )?40 120\r?\n/);
  assert.match(out, /echo hel''lo; stty size\r?\n/);
  t.write("exit 4\n");
  assert.deepEqual(await t.wait(), { code: 4, signal: null, oomKilled: false });
});

test("^C reaches the terminal's foreground job", async () => {
  const t = await project.terminal({ argv: ["sh", "-c", "trap 'echo interrupted; exit 9' INT; echo ready; while :; do sleep 0.1; done"] });
  await until(t, /ready/);
  t.write("\x03");
  await until(t, /interrupted/);
  assert.equal((await t.wait()).code, 9);
});

test("a session's stdin, stdout and stderr", async () => {
  const s = await project.session(["sh", "-c", "cat; echo done >&2"]);
  s.write("piped\n");
  s.write(new Uint8Array([0, 255]));
  s.closeStdin();
  const out = [];
  const err = [];
  for await (const c of s) (c.stream === "stdout" ? out : err).push(c.data);
  assert.deepEqual(Buffer.concat(out), Buffer.concat([Buffer.from("piped\n"), Buffer.from([0, 255])]));
  assert.equal(Buffer.concat(err).toString(), "done\n");
  assert.equal((await s.wait()).code, 0);
});

test("a session whose program cannot start is a StartError", async () => {
  // The daemon may report it before "started" or after it.
  await assert.rejects(
    project.session(["/no/such/program"]).then((s) => s.wait()),
    (e) => e instanceof StartError && /no such file/.test(e.message),
  );
});
