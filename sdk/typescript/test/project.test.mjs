// Sites, Git reads, exports and language servers of a project.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { before, test } from "node:test";

import { ForbiddenError } from "../dist/index.js";
import { client, eventually, newProject } from "./helpers.mjs";

let corral, project;
before(async () => {
  corral = await client();
  project = await newProject(corral);
});

test("a published site answers through the gateway", async () => {
  await project.files.write("index.html", "<p>from the machine</p>\n");
  const server = await project.processes.start(["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1"]);
  try {
    const name = `ts-${process.pid}-${Date.now()}`;
    const site = await project.sites.publish(name, 8123);
    assert.equal(site.port, 8123);
    assert.deepEqual(
      (await project.sites.list()).map((s) => s.name),
      [name],
    );
    let res;
    assert.ok(await eventually(async () => (res = await corral.site(name, "/index.html")).status === 200), `status ${res?.status}`);
    assert.equal(await res.text(), "<p>from the machine</p>\n");
    // The gateway redirects /sites/{name} to its root.
    assert.equal((await corral.site(name, "")).status, 308);
    await project.sites.unpublish(name);
    assert.deepEqual(await project.sites.list(), []);
  } finally {
    await server.kill();
  }
});

test("Git reads of the workspace", async () => {
  assert.equal((await project.git.status()).isRepo, false);
  const r = await project.run(["sh", "-c", "git init -q -b main . && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m first && git rev-parse HEAD"]);
  assert.equal(r.code, 0, r.stderrText);
  const head = r.stdoutText.trim();
  assert.equal((await project.git.status()).isRepo, true);
  const log = await project.git.log({ limit: 5 });
  assert.ok(JSON.stringify(log).includes(head), JSON.stringify(log));
  // A daemon without --export-remote refuses every export.
  await assert.rejects(project.export({ remote: "https://example.com/r.git", branch: "main", expectedHead: head }), ForbiddenError);
});

test("a language server's session", { skip: !existsSync("/usr/local/bin/gopls") && !existsSync("/usr/bin/gopls") && "no gopls" }, async () => {
  const lsp = await project.lsp("gopls");
  lsp.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { processId: null, rootUri: "file:///workspace", capabilities: {} } });
  for await (const m of lsp) {
    if (m.id === 1) {
      assert.ok(m.result.capabilities, JSON.stringify(m));
      break;
    }
  }
  lsp.close();
});
