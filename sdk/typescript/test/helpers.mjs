// Test helpers: a real daemon from sdk/testdaemon (shared by the files of a
// run through CORRAL_URL/CORRAL_TOKEN, see run.mjs, or started for one
// file), and fresh projects.

import { execFile } from "node:child_process";
import { createServer, connect } from "node:net";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Corral } from "../dist/index.js";

export const sdkDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const repoDir = resolve(sdkDir, "../..");
const run = promisify(execFile);

/** Starts a daemon of its own on a new state directory; `stop()` ends it. */
export async function startDaemon() {
  // A short path: a Unix socket's path has at most 107 bytes.
  const state = mkdtempSync(join(tmpdir(), "sdkts-"));
  await run(join(repoDir, "sdk/testdaemon/start"), [state], { maxBuffer: 1 << 20 });
  const env = Object.fromEntries(
    readFileSync(join(state, "env"), "utf8")
      .trim()
      .split("\n")
      .map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]),
  );
  return {
    state,
    url: env.CORRAL_URL,
    token: env.CORRAL_TOKEN,
    adminToken: env.CORRAL_ADMIN_TOKEN,
    pid: Number(env.CORRAL_PID),
    stop: async () => {
      await run(join(repoDir, "sdk/testdaemon/stop"), [state]);
      rmSync(state, { recursive: true, force: true });
    },
  };
}

/**
 * A TCP listener on 127.0.0.1 that forwards each connection to the daemon's
 * Unix socket: the SDK then speaks over fetch and TCP WebSockets, as in a
 * browser or against `corral daemon --listen`. A connection whose daemon
 * side breaks is reset, as the daemon's own would be.
 */
export async function tcpProxy(unixUrl) {
  const socketPath = unixUrl.slice("unix://".length);
  const conns = new Set();
  const server = createServer((c) => {
    const u = connect(socketPath);
    conns.add(c);
    c.on("close", () => {
      conns.delete(c);
      u.destroy();
    });
    c.pipe(u);
    u.pipe(c);
    u.on("error", () => c.resetAndDestroy());
    c.on("error", () => u.destroy());
    u.on("close", () => c.destroyed || c.resetAndDestroy());
    conns.add(u);
    u.on("close", () => conns.delete(u));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => {
      for (const c of conns) c.destroy();
      return new Promise((r) => server.close(r));
    },
  };
}

/** Over TCP when CORRAL_TEST_TRANSPORT is "tcp" (run.mjs runs the suite both ways). */
export const overTCP = process.env.CORRAL_TEST_TRANSPORT === "tcp";

let shared;
let ownDaemon;
const proxies = [];
// Registered at load (a hook registered inside another runs too early).
after(async () => {
  for (const p of proxies) await p.close();
  if (ownDaemon) await (await ownDaemon).stop();
});

/** The URL to reach daemon `d` by in this run: its socket, or a TCP proxy to it. */
export async function urlOf(d) {
  if (!overTCP) return d.url;
  const p = await tcpProxy(d.url);
  proxies.push(p);
  return p.url;
}

/**
 * The daemon of this test file: the run's (CORRAL_URL, CORRAL_TOKEN and
 * CORRAL_ADMIN_TOKEN set by run.mjs) or one started for the file.
 */
export async function daemon() {
  if (!shared) {
    if (process.env.CORRAL_URL && process.env.CORRAL_TOKEN) {
      shared = Promise.resolve({ url: process.env.CORRAL_URL, token: process.env.CORRAL_TOKEN, adminToken: process.env.CORRAL_ADMIN_TOKEN });
    } else {
      shared = ownDaemon = startDaemon();
    }
  }
  const d = await shared;
  d.via ??= urlOf(d);
  return { ...d, url: await d.via, unixURL: d.url };
}

/** A client of the file's daemon. */
export async function client(opts = {}) {
  const d = await daemon();
  return new Corral({ url: d.url, token: d.token, ...opts });
}

let seq = 0;

/** A new managed project of the account. */
export async function newProject(corral) {
  return corral.projects.create({ name: `ts-${process.pid}-${Date.now()}-${seq++}` });
}

/** Collects an async iterable's chunks: their bytes and texts, and all of it joined. */
export async function collect(it) {
  const parts = [];
  const texts = [];
  for await (const c of it) {
    parts.push(c.data);
    texts.push(c.text);
  }
  return { parts, texts, text: texts.join(""), bytes: Buffer.concat(parts) };
}

/** The host's processes whose command line is `argv` (the tests run as root, beside the machines). */
export function hostProcesses(argv) {
  const found = [];
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    let cmd;
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0$/, "").split("\0").join(" ");
    } catch {
      continue;
    }
    if (cmd === argv) found.push(`${pid}: ${cmd}`);
  }
  return found;
}

/** Polls `cond` until it holds or `ms` passed; answers whether it held. */
export async function eventually(cond, ms = 10000) {
  const end = Date.now() + ms;
  for (;;) {
    if (await cond()) return true;
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}
