// The SDK loads where there is no Node: its modules import only each other
// statically; node:http, node:stream and ws are imported when used (Unix
// sockets, WebSockets on Node).

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { sdkDir } from "./helpers.mjs";

test("the compiled modules import nothing but each other statically", () => {
  const dist = join(sdkDir, "dist");
  const files = readdirSync(dist).filter((f) => f.endsWith(".js"));
  assert.ok(files.includes("index.js"));
  for (const f of files) {
    const src = readFileSync(join(dist, f), "utf8");
    for (const m of src.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s*["']([^"']+)["']|^\s*import\s*["']([^"']+)["']/gm)) {
      const spec = m[1] ?? m[2];
      assert.ok(spec.startsWith("./"), `${f} imports ${spec} statically`);
    }
    assert.doesNotMatch(src, /\brequire\(/, `${f} calls require`);
  }
});
