import assert from "node:assert/strict";
import { before, test } from "node:test";

import {
  AbortError,
  BadGatewayError,
  ConflictError,
  Corral,
  CorralError,
  DeadlineError,
  ForbiddenError,
  InvalidError,
  NotFoundError,
  OverflowError,
  PrepareError,
  RateLimitedError,
  StartError,
  TimeoutError,
  UnauthorizedError,
} from "../dist/index.js";
import { client, collect, daemon, eventually, hostProcesses, newProject } from "./helpers.mjs";

let corral, project;
before(async () => {
  corral = await client();
  project = await newProject(corral);
});

test("a nonzero exit is a result, not an error", async () => {
  const r = await project.run(["sh", "-c", "echo out; echo err >&2; exit 3"]);
  assert.equal(r.code, 3);
  assert.equal(r.signal, null);
  assert.equal(r.oomKilled, false);
  assert.equal(r.ok, false);
  assert.equal(r.stdoutText, "out\n");
  assert.equal(r.stderrText, "err\n");
  assert.deepEqual(Array.from(r.stdout), Array.from(Buffer.from("out\n")));
});

test("a death by a signal is a result", async () => {
  const r = await project.run(["sh", "-c", "kill -KILL $$"]);
  assert.equal(r.code, null);
  assert.equal(r.signal, "SIGKILL");
});

test("stdin, env, cwd and bytes that are not UTF-8", async () => {
  const r = await project.run(["sh", "-c", 'cat; printf "%s" "$GREETING"; pwd; printf "\\377\\376"'], {
    stdin: "from stdin\n",
    env: { GREETING: "hi\n" },
    cwd: "/home/corral",
  });
  assert.equal(r.code, 0);
  assert.deepEqual(Array.from(r.stdout), Array.from(Buffer.concat([Buffer.from("from stdin\nhi\n/home/corral\n"), Buffer.from([0xff, 0xfe])])));
});

test("onStdout and onStderr receive the output as it arrives", async () => {
  const out = [];
  const err = [];
  const r = await project.run(["sh", "-c", "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c"], {
    onStdout: (c) => out.push(c.text),
    onStderr: (c) => err.push(c.text),
  });
  assert.equal(r.code, 0);
  assert.equal(out.join(""), "a\nc\n");
  assert.equal(err.join(""), "b\n");
  assert.ok(out.length >= 2, `stdout came in ${out.length} chunk(s)`);
  assert.equal(r.stdoutText, "a\nc\n");
});

// A 3-byte character (U+20AC, e2 82 ac) cut after its first and after its
// second byte: the chunks split it, their text never does.
const euros = "printf '\\342'; sleep 0.3; printf '\\202'; sleep 0.3; printf '\\254\\342\\202'; sleep 0.3; printf '\\254'";

function assertWholeCharacters(parts, texts) {
  assert.ok(
    parts.some((p) => p.length > 0 && p.length % 3 !== 0),
    `the chunks did not split a character (${parts.map((p) => p.length)}): the test tests nothing`,
  );
  for (const t of texts) assert.ok(!t.includes("\ufffd"), `a chunk's text holds U+FFFD: ${JSON.stringify(texts)}`);
  assert.equal(texts.join(""), "€€");
}

test("a 3-byte UTF-8 character split across every chunk boundary arrives whole (streamed command)", async () => {
  const stream = project.stream(["sh", "-c", euros]);
  const { parts, texts } = await collect(stream);
  assertWholeCharacters(parts, texts);
  const r = await stream.result();
  assert.equal(r.stdoutText, "€€");
});

test("a 3-byte UTF-8 character split across every chunk boundary arrives whole (onStdout)", async () => {
  const parts = [];
  const texts = [];
  await project.run(["sh", "-c", euros], {
    onStdout: (c) => {
      parts.push(c.data);
      texts.push(c.text);
    },
  });
  assertWholeCharacters(parts, texts);
});

test("a 3-byte UTF-8 character split across every chunk boundary arrives whole (session)", async () => {
  const s = await project.session(["sh", "-c", euros]);
  const { parts, texts } = await collect(s);
  assertWholeCharacters(parts, texts);
  assert.deepEqual(await s.wait(), { code: 0, signal: null, oomKilled: false });
});

test("a timeout is a TimeoutError with the partial output", async () => {
  await assert.rejects(project.run(["sh", "-c", "echo before; echo oops >&2; sleep 30"], { timeoutMs: 1000 }), (e) => {
    assert.ok(e instanceof TimeoutError, e);
    assert.ok(e instanceof CorralError);
    assert.equal(e.kind, "timeout");
    assert.equal(e.status, 504);
    assert.equal(e.stdoutText, "before\n");
    assert.equal(e.stderrText, "oops\n");
    return true;
  });
});

test("a timeout while streaming is a TimeoutError with the partial output", async () => {
  const stream = project.stream(["sh", "-c", "echo before; sleep 30"], { timeoutMs: 1000 });
  const seen = [];
  await assert.rejects(
    (async () => {
      for await (const c of stream) seen.push(c.text);
    })(),
    (e) => {
      assert.ok(e instanceof TimeoutError, e);
      assert.equal(e.status, 504, "the status an unstreamed answer has");
      assert.equal(e.stdoutText, "before\n");
      return true;
    },
  );
  assert.equal(seen.join(""), "before\n");
});

test("output over its limit is an OverflowError with the output up to it", async () => {
  await assert.rejects(project.run(["sh", "-c", "printf 0123456789; sleep 0.2; printf abcdefghij"], { limits: { stdout: 12 } }), (e) => {
    assert.ok(e instanceof OverflowError, e);
    assert.equal(e.status, 413);
    assert.equal(e.stdoutText, "0123456789ab");
    return true;
  });
});

test("a program that cannot start is a StartError with its reason", async () => {
  await assert.rejects(project.run(["/no/such/program"]), (e) => {
    assert.ok(e instanceof StartError, e);
    assert.equal(e.kind, "start");
    assert.equal(e.status, 422);
    assert.equal(e.reason, "notFound");
    return true;
  });
  await assert.rejects(project.run(["/etc/hostname"]), (e) => e instanceof StartError && e.reason === "notExecutable");
});

test("a bad token is an UnauthorizedError", async () => {
  const d = await daemon();
  const bad = new Corral({ url: d.url, token: "corral_not-a-token" });
  await assert.rejects(bad.whoami(), UnauthorizedError);
  await assert.rejects(bad.project(project.id).run(["true"]), UnauthorizedError);
});

test("another account's project is a ForbiddenError, as one that does not exist", async () => {
  const d = await daemon();
  const admin = new Corral({ url: d.url, token: d.adminToken });
  const theirs = await newProject(admin);
  await assert.rejects(corral.project(theirs.id).run(["true"]), ForbiddenError);
  await assert.rejects(corral.projects.get(theirs.id), ForbiddenError);
  await assert.rejects(corral.projects.get(999999), ForbiddenError);
  await assert.rejects(theirs.files.read("/etc/hostname").then(() => corral.project(theirs.id).files.read("/etc/hostname")), ForbiddenError);
  // An admin sees an unknown project's policy as not found.
  await assert.rejects(admin.projects.egress(999999), NotFoundError);
  await theirs.delete();
});

test("a refused preparation is a PrepareError", async () => {
  await assert.rejects(project.run(["pwd"], { cwd: "/tmp" }), (e) => {
    assert.ok(e instanceof PrepareError, e);
    assert.equal(e.kind, "prepare");
    assert.equal(e.status, 400);
    return true;
  });
});

test("a malformed request is an InvalidError; an existing name a ConflictError", async () => {
  await assert.rejects(project.run(["true"], { env: { "BAD NAME": "x" } }), (e) => e instanceof CorralError && e.status === 400);
  await assert.rejects(project.files.stat("../x"), InvalidError);
  await assert.rejects(corral.projects.create({ name: project.name }), ConflictError);
});

for (const [how, opts, cls] of [
  ["aborting a run is an AbortError", (ctl) => ({ signal: ctl.signal }), AbortError],
  ["a run past its client-side deadline is a DeadlineError", () => ({ deadlineMs: 1500 }), DeadlineError],
]) {
  test(`${how}, and the command does not outlive it`, async () => {
    const mark = `${Math.floor(Math.random() * 1e6) + 3000000}`;
    const ctl = new AbortController();
    const running = project.run(["sleep", mark], { timeoutMs: 60000, ...opts(ctl) });
    running.catch(() => {});
    assert.ok(await eventually(() => hostProcesses(`sleep ${mark}`).length === 1), "the command runs");
    if (cls === AbortError) ctl.abort();
    await assert.rejects(running, (e) => e instanceof cls && e.status === 0);
    assert.ok(await eventually(() => hostProcesses(`sleep ${mark}`).length === 0), "the command was killed");
  });
}

test("too many background processes is a RateLimitedError with retryAfter", async () => {
  const p = await newProject(corral);
  const started = [];
  try {
    let err;
    for (let i = 0; i < 64 && !err; i++) {
      try {
        started.push(await p.processes.start(["sleep", "60"]));
      } catch (e) {
        err = e;
      }
    }
    assert.ok(err instanceof RateLimitedError, `${err}`);
    assert.equal(err.status, 429);
    assert.equal(err.kind, "busy");
    assert.ok(err.retryAfter >= 1, `retryAfter ${err.retryAfter}`);
  } finally {
    await Promise.all(started.map((s) => s.kill()));
  }
});

test("the account, its projects and their settings", async () => {
  const me = await corral.whoami();
  assert.equal(me.name, "sdk");
  const list = await corral.projects.list();
  assert.ok(list.some((p) => p.id === project.id));
  const got = await corral.projects.get(project.id);
  assert.equal(got.name, project.name);
  assert.equal(got.info.kind, "managed");
  const m = await project.setMachine({ limits: { pids: 100 } });
  assert.equal(m.limits.pids, 100);
  assert.equal((await project.refresh()).machine.limits.pids, 100);
  assert.equal((await project.egress()).mode, "none");
  const pol = await project.setEgress({ mode: "proxy", allow: ["example.com"] });
  assert.equal(pol.mode, "proxy");
  assert.deepEqual(await project.egressLog({ limit: 5 }), []);
  const members = await project.members();
  assert.deepEqual(
    members.map((m) => [m.account, m.role]),
    [["sdk", "owner"]],
  );
  const d = await daemon();
  const admin = new Corral({ url: d.url, token: d.adminToken });
  const other = `ts-member-${Date.now()}`;
  await admin.createAccount(other);
  const tok = await admin.createToken(other, { name: "t" });
  const added = await project.addMember({ account: other });
  assert.equal(added.role, "member");
  const them = new Corral({ url: d.url, token: tok.token });
  assert.equal((await them.project(project.id).run(["echo", "member"])).stdoutText, "member\n");
  await assert.rejects(them.projects.delete(project.id), ForbiddenError);
  assert.match(await corral.metrics(), /corral_commands_total/);
  assert.equal((await corral.openapi()).openapi.slice(0, 2), "3.");
  assert.equal((await corral.health()).status, "ok");
});

test("reset and delete", async () => {
  const p = await newProject(corral);
  await p.run(["true"]);
  await p.reset();
  await p.delete();
  await assert.rejects(corral.projects.get(p.id), ForbiddenError);
});

test("images are the administrators'", async () => {
  // listImages and pullImage: refused to an ordinary account; an administrator
  // lists the store, and a pull from a registry that does not answer (loopback
  // port 1) is a BadGatewayError and records nothing.
  await assert.rejects(corral.images(), ForbiddenError);
  await assert.rejects(corral.pullImage("127.0.0.1:1/nothing:latest"), ForbiddenError);
  const d = await daemon();
  const admin = new Corral({ url: d.url, token: d.adminToken });
  const before = (await admin.images()).map((i) => i.name);
  await assert.rejects(admin.pullImage("127.0.0.1:1/nothing:latest", { name: "nothing" }), BadGatewayError);
  await assert.rejects(admin.pullImage("127.0.0.1:1/nothing:latest", { name: "Not A Name" }), InvalidError);
  assert.deepEqual((await admin.images()).map((i) => i.name), before);
});
