// Runs the suite against one daemon of its own: starts it with
// sdk/testdaemon/start, runs `node --test` over the test files with its
// CORRAL_URL, CORRAL_TOKEN and CORRAL_ADMIN_TOKEN, twice: over its Unix
// socket (node:http), then over TCP (fetch; CORRAL_TEST_TRANSPORT=tcp), and
// stops it.

import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";

import { sdkDir, startDaemon } from "./helpers.mjs";

const d = await startDaemon();
let status = 1;
try {
  const files = readdirSync(join(sdkDir, "test"))
    .filter((f) => f.endsWith(".test.mjs"))
    .map((f) => join("test", f));
  for (const transport of ["unix", "tcp"]) {
    console.log(`# the suite over ${transport}`);
    const r = spawnSync(process.execPath, ["--test", "--test-concurrency=1", "--test-timeout=120000", ...process.argv.slice(2), ...files], {
      cwd: sdkDir,
      stdio: "inherit",
      env: { ...process.env, CORRAL_URL: d.url, CORRAL_TOKEN: d.token, CORRAL_ADMIN_TOKEN: d.adminToken, CORRAL_TEST_TRANSPORT: transport },
    });
    status = r.status ?? 1;
    if (status !== 0) break;
  }
} finally {
  await d.stop();
}
process.exit(status);
