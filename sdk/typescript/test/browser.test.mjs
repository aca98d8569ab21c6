// The SDK in a browser (headless Chromium): a page served from the same
// origin as the API (a test server that serves dist/ and forwards the rest
// to the daemon) runs commands, streams output that splits a UTF-8
// character, follows a process's output, round-trips bytes through files,
// and gets a typed error with its partial output; WebSockets, which a
// browser cannot authorize with a bearer token, say so.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, request } from "node:http";
import { tmpdir } from "node:os";
import { join, normalize } from "node:path";
import { test } from "node:test";

import { client, daemon, newProject, sdkDir } from "./helpers.mjs";

const chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));

const page = (token, projectId) => `<!doctype html><meta charset="utf-8"><script type="module">
import { Corral, TimeoutError, CorralError } from "/dist/index.js";
const out = {};
try {
  const corral = new Corral({ url: location.origin, token: ${JSON.stringify(token)} });
  const project = corral.project(${projectId});
  const r = await project.run(["sh", "-c", "echo hello; exit 3"]);
  out.run = [r.code, r.stdoutText];
  const texts = [];
  const sizes = [];
  for await (const c of project.stream(["sh", "-c", "printf '\\\\342'; sleep 0.3; printf '\\\\202'; sleep 0.3; printf '\\\\254'"])) {
    texts.push(c.text);
    sizes.push(c.data.length);
  }
  out.stream = [texts, sizes];
  const proc = await project.processes.start(["sh", "-c", "echo one; sleep 0.3; echo two"]);
  let text = "";
  for await (const c of proc.output()) text += c.text;
  out.process = text;
  const all = new Uint8Array(256).map((_, i) => i);
  await project.files.write("b.bin", all);
  out.bytes = Array.from(await project.files.read("b.bin")).every((v, i) => v === i);
  try {
    await project.run(["sh", "-c", "echo partial; sleep 10"], { timeoutMs: 500 });
  } catch (e) {
    out.timeout = [e instanceof TimeoutError, e.status, e.stdoutText];
  }
  try {
    await project.terminal();
  } catch (e) {
    out.ws = [e instanceof CorralError, e.kind];
  }
} catch (e) {
  out.error = String(e && e.stack || e);
}
await fetch("/result", { method: "POST", body: JSON.stringify(out) });
</script>`;

test("the SDK in a browser", { skip: !chromium && "no chromium" }, async () => {
  const d = await daemon();
  const corral = await client();
  const project = await newProject(corral);
  const socketPath = d.unixURL.slice("unix://".length);
  let resolveResult;
  const result = new Promise((r) => (resolveResult = r));
  const server = createServer((req, res) => {
    if (req.url === "/") {
      res.writeHead(200, { "Content-Type": "text/html" });
      return res.end(page(d.token, project.id));
    }
    if (req.url.startsWith("/dist/")) {
      const file = normalize(join(sdkDir, req.url.split("?")[0]));
      if (!file.startsWith(join(sdkDir, "dist")) || !existsSync(file)) return res.writeHead(404).end();
      res.writeHead(200, { "Content-Type": "text/javascript" });
      return res.end(readFileSync(file));
    }
    if (req.url === "/result") {
      const parts = [];
      req.on("data", (c) => parts.push(c));
      req.on("end", () => {
        res.end();
        resolveResult(JSON.parse(Buffer.concat(parts).toString()));
      });
      return;
    }
    // The API, forwarded to the daemon's socket.
    const up = request({ socketPath, path: req.url, method: req.method, headers: req.headers }, (ures) => {
      res.writeHead(ures.statusCode, ures.headers);
      ures.pipe(res);
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const profile = mkdtempSync(join(tmpdir(), "sdkts-chromium-"));
  const browser = spawn(
    chromium,
    ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", `--user-data-dir=${profile}`, `http://127.0.0.1:${server.address().port}/`],
    // Its own process group: its renderers and helpers end with it.
    { stdio: "ignore", detached: true },
  );
  const exited = new Promise((r) => browser.once("exit", r));
  try {
    let timer;
    const late = new Promise((_, no) => (timer = setTimeout(() => no(new Error("no result from the page within 60 s")), 60000)));
    const out = await Promise.race([result, late]).finally(() => clearTimeout(timer));
    assert.equal(out.error, undefined, out.error);
    assert.deepEqual(out.run, [3, "hello\n"]);
    assert.deepEqual(out.stream[0].join(""), "€");
    assert.ok(out.stream[0].every((t) => !t.includes("\ufffd")), JSON.stringify(out.stream));
    assert.ok(out.stream[1].length > 1, `the character came in one chunk: ${out.stream[1]}`);
    assert.equal(out.process, "one\ntwo\n");
    assert.equal(out.bytes, true);
    assert.deepEqual(out.timeout, [true, 504, "partial\n"]);
    assert.deepEqual(out.ws, [true, "unsupported"]);
  } finally {
    process.kill(-browser.pid, "SIGKILL");
    await exited;
    server.closeAllConnections();
    server.close();
    rmSync(profile, { recursive: true, force: true, maxRetries: 10 });
  }
});
