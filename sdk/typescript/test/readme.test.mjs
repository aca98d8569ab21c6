// The README's quickstart runs as written.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

import { daemon, sdkDir } from "./helpers.mjs";

test("the README's quickstart runs as written, in at most 15 lines", async () => {
  const readme = readFileSync(join(sdkDir, "README.md"), "utf8");
  const code = readme.split("## Quickstart")[1].match(/```js\n([\s\S]*?)```/)[1];
  assert.ok(code.trimEnd().split("\n").length <= 15, "the quickstart is longer than 15 lines");
  // Inside the package, so that it imports the package by its name.
  const file = join(sdkDir, `quickstart-${process.pid}.mjs`);
  writeFileSync(file, code);
  try {
    const d = await daemon();
    const { stdout } = await promisify(execFile)(process.execPath, [file], {
      env: { ...process.env, CORRAL_URL: d.url, CORRAL_TOKEN: d.token },
      timeout: 60000,
    });
    assert.equal(stdout, "3 hello\n\ntick 1\ntick 2\ntick 3\nwritten from TypeScript\n\n");
  } finally {
    rmSync(file, { force: true });
  }
});
