// A daemon that stops answering or dies mid-call: every call ends within
// its deadline with a DeadlineError or a ConnectionError, never hangs. This
// file kills its own daemon.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { ConnectionError, Corral, DeadlineError, TimeoutError, TransportError } from "../dist/index.js";
import { newProject, startDaemon, urlOf } from "./helpers.mjs";

let d, corral, project;
before(async () => {
  d = await startDaemon();
  corral = new Corral({ url: await urlOf(d), token: d.token, deadlineMs: 20000 });
  project = await newProject(corral);
});
after(async () => {
  try {
    process.kill(d.pid, "SIGCONT");
  } catch {
    // gone
  }
  await d.stop();
});

test("a daemon that does not answer is a DeadlineError within the deadline", async () => {
  process.kill(d.pid, "SIGSTOP");
  try {
    const t0 = Date.now();
    await assert.rejects(corral.whoami({ deadlineMs: 1000 }), (e) => {
      assert.ok(e instanceof DeadlineError, e);
      assert.ok(e instanceof TimeoutError);
      assert.equal(e.status, 0);
      return true;
    });
    const took = Date.now() - t0;
    assert.ok(took >= 900 && took < 5000, `took ${took} ms`);
  } finally {
    process.kill(d.pid, "SIGCONT");
  }
  assert.equal((await corral.whoami()).name, "sdk");
});

test("a daemon that stops answering an open terminal, watch or followed output is a DeadlineError within two keepalives", async () => {
  const c = new Corral({ url: await urlOf(d), token: d.token, keepaliveMs: 700 });
  const p = c.project(project.id);
  const term = await p.terminal();
  const watch = (await p.files.watch("/workspace"))[Symbol.asyncIterator]();
  const proc = await p.processes.start(["sh", "-c", "echo up; sleep 60"]);
  const out = proc.output()[Symbol.asyncIterator]();
  assert.equal((await out.next()).value.text, "up\n");
  process.kill(d.pid, "SIGSTOP");
  try {
    const t0 = Date.now();
    const read = async () => {
      while (await term.read());
    };
    const [r, w, o] = await Promise.allSettled([read(), watch.next(), out.next()]);
    assert.ok(r.reason instanceof DeadlineError, `the terminal: ${r.status} ${r.reason?.stack}`);
    assert.ok(w.reason instanceof DeadlineError, `the watch: ${w.status} ${w.reason?.stack}`);
    assert.ok(o.reason instanceof DeadlineError, `the output: ${o.status} ${o.reason?.stack}`);
    const took = Date.now() - t0;
    assert.ok(took < 4000, `took ${took} ms`);
  } finally {
    process.kill(d.pid, "SIGCONT");
  }
  await proc.kill();
  // Resumed, the daemon serves terminals again.
  const t2 = await project.terminal();
  t2.write("exit 5\n");
  assert.equal((await t2.wait()).code, 5);
});

test("the daemon killed mid-call is a ConnectionError within the deadline", async () => {
  const deadlineMs = 15000;
  // A plain run, a streamed run, a followed process output, a terminal and
  // a watch, all in flight.
  const plain = project.run(["sleep", "60"], { timeoutMs: 120000, deadlineMs });
  const stream = project.stream(["sh", "-c", "echo started; sleep 60"], { timeoutMs: 120000, deadlineMs });
  const it = stream[Symbol.asyncIterator]();
  assert.equal((await it.next()).value.text, "started\n");
  const proc = await project.processes.start(["sh", "-c", "echo up; sleep 60"]);
  const out = proc.output({ deadlineMs })[Symbol.asyncIterator]();
  assert.equal((await out.next()).value.text, "up\n");
  const term = await project.terminal({ deadlineMs });
  const watch = (await project.files.watch("/workspace", { deadlineMs }))[Symbol.asyncIterator]();
  const t0 = Date.now();
  process.kill(d.pid, "SIGKILL");
  const broken = (e) => e instanceof ConnectionError && e instanceof TransportError && e.kind === "transport";
  await assert.rejects(plain, broken);
  await assert.rejects(
    (async () => {
      for (;;) if ((await it.next()).done) return;
    })(),
    (e) => {
      assert.ok(broken(e), e);
      assert.equal(e.stdoutText, "started\n", "the partial output");
      return true;
    },
  );
  await assert.rejects(out.next(), broken);
  await assert.rejects(term.wait(), broken);
  await assert.rejects(watch.next(), broken);
  const took = Date.now() - t0;
  assert.ok(took < deadlineMs, `took ${took} ms`);
  // And the next call fails at once.
  const t1 = Date.now();
  await assert.rejects(corral.whoami(), broken);
  assert.ok(Date.now() - t1 < 2000);
});
