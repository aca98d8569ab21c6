// Bounded commands: POST /v1/projects/{id}/commands, whole or streamed
// (NDJSON), always with base64 output so that bytes arrive exactly.

import { Caller, projectPath } from "./caller.js";
import { AbortError, ProtocolError, statusOfKind } from "./errors.js";
import { bytesOf, ChunkDecoder, concat, utf8 } from "./output.js";
import { errorFromBody, fromBase64, lines, parseLine, toBase64 } from "./transport.js";
import type { CallOptions, Exit, OutputChunk, OutputLimits } from "./types.js";

export interface RunOptions extends CallOptions {
  /** Working directory (default /workspace in a managed machine). */
  cwd?: string;
  /** Variables over the sandbox's defaults. */
  env?: Record<string, string>;
  /** Who runs it in a managed machine: a user name or uid, optionally ":group". */
  user?: string;
  /** The command's standard input (empty without it). */
  stdin?: Uint8Array | string;
  /** The command's timeout (default the daemon's, 10 s): past it, a TimeoutError with the output so far. */
  timeoutMs?: number;
  /** Output limits (default 64 MiB a stream): past one, an OverflowError with the output up to it. */
  limits?: OutputLimits;
  /** The lease kind the command runs under ("terminal" by default). */
  leaseKind?: string;
  /** Receives stdout as it arrives (the answer is then streamed). */
  onStdout?: (chunk: OutputChunk) => void;
  /** Receives stderr as it arrives. */
  onStderr?: (chunk: OutputChunk) => void;
}

/**
 * The result of a completed command, whatever its exit code: a nonzero exit
 * or a death by a signal is a result, never an error.
 */
export class RunResult implements Exit {
  constructor(
    readonly code: number | null,
    readonly signal: string | null,
    readonly oomKilled: boolean,
    readonly stdout: Uint8Array,
    readonly stderr: Uint8Array,
  ) {}

  /** stdout as text (invalid UTF-8 becomes U+FFFD). */
  get stdoutText(): string {
    return utf8.decode(this.stdout);
  }

  get stderrText(): string {
    return utf8.decode(this.stderr);
  }

  /** True for exit code 0. */
  get ok(): boolean {
    return this.code === 0;
  }
}

// The daemon writes the whole answer within the command's timeout plus 30 s;
// preparing the machine comes before. The default deadline of run leaves
// room for both.
const defaultCommandTimeoutMs = 10_000;
const answerGraceMs = 45_000;

function requestBody(argv: string[], o: RunOptions): Record<string, unknown> {
  if (argv.length === 0) throw new TypeError("corral: run needs a program: argv is empty");
  const body: Record<string, unknown> = {
    command: { type: "argv", file: argv[0], args: argv.slice(1) },
    encoding: "base64",
  };
  if (o.cwd !== undefined) body.cwd = o.cwd;
  if (o.user !== undefined) body.user = o.user;
  if (o.env !== undefined) body.env = o.env;
  if (o.stdin !== undefined) body.stdin = toBase64(bytesOf(o.stdin));
  if (o.timeoutMs !== undefined) body.timeoutMs = o.timeoutMs;
  if (o.limits !== undefined) body.outputLimit = o.limits;
  if (o.leaseKind !== undefined) body.leaseKind = o.leaseKind;
  return body;
}

function resultOf(v: Record<string, unknown>): RunResult {
  return new RunResult(
    (v.code as number | null) ?? null,
    (v.signal as string | null) ?? null,
    v.oomKilled === true,
    fromBase64(String(v.stdout ?? "")),
    fromBase64(String(v.stderr ?? "")),
  );
}

function deadlineOf(o: RunOptions): number {
  return o.deadlineMs ?? (o.timeoutMs || defaultCommandTimeoutMs) + answerGraceMs;
}

/** Runs a command and answers its result once it completed (runCommand). */
export async function run(c: Caller, projectId: number, argv: string[], o: RunOptions = {}): Promise<RunResult> {
  if (o.onStdout || o.onStderr) {
    const gen = streamed(c, projectId, argv, o);
    for (;;) {
      const r = await gen.next();
      if (r.done) return r.value;
      (r.value.stream === "stdout" ? o.onStdout : o.onStderr)?.(r.value);
    }
  }
  const v = await c.json<Record<string, unknown>>(
    "POST",
    projectPath(projectId, "commands"),
    { json: requestBody(argv, o), base64Output: true, deadlineMs: deadlineOf(o) },
    { signal: o.signal },
  );
  return resultOf(v);
}

/**
 * The streamed answer: chunks as they arrive, then the result. Returning
 * early (a `break` out of the loop) closes the request, which makes the
 * daemon abort the command.
 */
export async function* streamed(c: Caller, projectId: number, argv: string[], o: RunOptions = {}): AsyncGenerator<OutputChunk, RunResult> {
  const { res, deadline, what } = await c.open(
    "POST",
    projectPath(projectId, "commands"),
    { json: requestBody(argv, o), base64Output: true, headers: { Accept: "application/x-ndjson, application/json" }, deadlineMs: deadlineOf(o) },
    { signal: o.signal },
  );
  const dec = new ChunkDecoder();
  const seen = { stdout: [] as Uint8Array[], stderr: [] as Uint8Array[] };
  try {
    if (!(res.headers.get("content-type") ?? "").startsWith("application/x-ndjson")) {
      return resultOf(JSON.parse(await res.text()));
    }
    for await (const line of lines(res.body!)) {
      const v = parseLine(what, line);
      if (v.error !== undefined) {
        // The last line of a streamed answer: its status is the one an
        // unstreamed answer would have had.
        const kind = String((v.error as { kind?: unknown }).kind);
        throw errorFromBody(line, statusOfKind(kind, 500), true);
      }
      if ("code" in v) return resultOf(v);
      for (const stream of ["stdout", "stderr"] as const) {
        if (typeof v[stream] === "string") {
          const data = fromBase64(v[stream] as string);
          seen[stream].push(data);
          yield dec.chunk(stream, data);
        }
      }
    }
    throw new ProtocolError("protocol", `corral: ${what}: the streamed answer ended without a result`);
  } catch (err) {
    throw deadline.error(what, err, { stdout: concat(seen.stdout), stderr: concat(seen.stderr) });
  } finally {
    // Returned early or not, the request ends here: the daemon aborts a
    // command whose request closed.
    deadline.cancel();
    deadline.done();
  }
}

/**
 * CommandStream is a command's live output: iterate it for chunks (each
 * stream's text never splits a UTF-8 character), then await `result()`.
 * `result()` alone reads the rest of the output and answers the result.
 */
export class CommandStream implements AsyncIterable<OutputChunk> {
  private outcome: RunResult | undefined;
  private started = false;
  private closed = false;

  constructor(private readonly gen: AsyncGenerator<OutputChunk, RunResult>) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<OutputChunk> {
    if (this.started) throw new TypeError("corral: a CommandStream is iterated once");
    this.started = true;
    try {
      for (;;) {
        const r = await this.gen.next();
        if (r.done) {
          this.outcome = r.value;
          return;
        }
        yield r.value;
      }
    } finally {
      if (!this.outcome) await this.close();
    }
  }

  /** Reads what is left of the output and answers the command's result (or throws its error). */
  async result(): Promise<RunResult> {
    if (this.outcome) return this.outcome;
    if (this.closed) throw new AbortError("abort", "corral: the command's stream was closed before it completed");
    this.started = true;
    for (;;) {
      const r = await this.gen.next();
      if (r.done) return (this.outcome = r.value);
    }
  }

  /** Stops reading: the daemon aborts the command. */
  async close(): Promise<void> {
    this.closed = true;
    await this.gen.return(undefined as unknown as RunResult);
  }
}
