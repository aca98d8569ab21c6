// Sessions: one command whose standard streams travel over a WebSocket
// (stdin 0x00‖bytes; stdout 0x01‖bytes, stderr 0x02‖bytes), optionally on a
// terminal (PTY) that can be resized; and language servers (one JSON-RPC
// message per text message).

import { Caller, envQuery, projectPath } from "./caller.js";
import { CorralError, DeadlineError, errorFor, ProtocolError, statusOfKind } from "./errors.js";
import { bytesOf, ChunkDecoder } from "./output.js";
import type { Message, Socket } from "./socket.js";
import type { CallOptions, Exit, OutputChunk } from "./types.js";

export interface SessionOptions extends CallOptions {
  cwd?: string;
  user?: string;
  env?: Record<string, string>;
  leaseKind?: string;
  /** Run it on a terminal of this size (default 24 × 80): all output then arrives as stdout. */
  tty?: { rows?: number; cols?: number };
}

/**
 * A running session. Read its output by iterating it (chunks whose text
 * never splits a UTF-8 character); `wait()` reads the rest and answers the
 * exit; `close()` ends it early (its process tree is cancelled).
 */
export class Session implements AsyncIterable<OutputChunk> {
  private readonly dec = new ChunkDecoder();
  private exit: Exit | undefined;
  private failure: CorralError | undefined;

  constructor(
    private readonly s: Socket,
    /** The lease the session holds. */
    readonly leaseId: string,
  ) {}

  /** Opens a session of `argv` in project `projectId` (openSession) and returns once it started. */
  static async open(c: Caller, projectId: number, argv: string[], o: SessionOptions = {}): Promise<Session> {
    if (argv.length === 0) throw new TypeError("corral: a session needs a program: argv is empty");
    const q = {
      argv,
      cwd: o.cwd,
      user: o.user,
      leaseKind: o.leaseKind,
      env: envQuery(o.env),
      tty: o.tty ? "1" : undefined,
      rows: o.tty?.rows,
      cols: o.tty?.cols,
    };
    const what = "session " + argv[0];
    // The daemon reads the socket (and answers pings) once it started.
    const s = await c.socket(projectPath(projectId, "sessions"), q, what, o, true);
    // The deadline bounds the wait for "started" too.
    const ms = o.deadlineMs ?? c.deadlineMs;
    const timer = ms > 0 && Number.isFinite(ms) ? setTimeout(() => s.fail(new DeadlineError("timeout", `corral: ${what}: not started within the client's deadline of ${ms} ms`)), ms) : undefined;
    let first: Message | undefined;
    try {
      first = await s.next();
    } finally {
      clearTimeout(timer);
    }
    const f = first && frame(first);
    if (f?.type === "started") {
      s.startKeepalive();
      return new Session(s, String(f.leaseId ?? ""));
    }
    s.close();
    if (f?.type === "error") throw errorFor(String(f.kind), String(f.message ?? ""), { status: statusOfKind(String(f.kind), 101), reason: typeof f.reason === "string" ? f.reason : undefined });
    throw new ProtocolError("protocol", `corral: session: the first message is not "started": ${JSON.stringify(f ?? null)}`);
  }

  /** Writes to the command's standard input (keystrokes, on a terminal). */
  write(data: string | Uint8Array): void {
    const b = bytesOf(data);
    const m = new Uint8Array(b.length + 1);
    m.set(b, 1);
    this.s.send(m);
  }

  /** Closes the command's standard input (nothing, on a terminal: send "\x04" there). */
  closeStdin(): void {
    this.s.send(JSON.stringify({ type: "eof" }));
  }

  /** Resizes the terminal; its foreground job gets SIGWINCH. */
  resize(rows: number, cols: number): void {
    this.s.send(JSON.stringify({ type: "resize", rows, cols }));
  }

  /** The next chunk of output, or undefined once the command ended. */
  async read(): Promise<OutputChunk | undefined> {
    for (;;) {
      if (this.exit) return undefined;
      if (this.failure) throw this.failure;
      const m = await this.s.next();
      if (!m) {
        this.failure = new CorralError("transport", "corral: session: the daemon closed the session without an exit");
        throw this.failure;
      }
      if (m.data) {
        const stream = m.data[0] === 2 ? "stderr" : "stdout";
        return this.dec.chunk(stream, m.data.subarray(1));
      }
      const f = frame(m);
      if (f.type === "exit") {
        this.exit = { code: (f.code as number | null) ?? null, signal: (f.signal as string | null) ?? null, oomKilled: f.oomKilled === true };
        this.s.close();
      } else if (f.type === "error") {
        this.failure = errorFor(String(f.kind), String(f.message ?? ""), { status: statusOfKind(String(f.kind), 101), reason: typeof f.reason === "string" ? f.reason : undefined });
        this.s.close();
      }
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<OutputChunk> {
    for (;;) {
      const c = await this.read();
      if (!c) return;
      yield c;
    }
  }

  /** Reads (and drops) the rest of the output, and answers how the command ended. */
  async wait(): Promise<Exit> {
    while (await this.read());
    return this.exit!;
  }

  /** Ends the session: the command's process tree is cancelled. */
  close(): void {
    this.s.close();
  }
}

function frame(m: Message): Record<string, unknown> {
  if (m.text === undefined) throw new ProtocolError("protocol", "corral: session: a binary message where a text message was due");
  return JSON.parse(m.text);
}

/** A language server's session: one JSON-RPC message per text message. */
export class LSPSession implements AsyncIterable<unknown> {
  constructor(private readonly s: Socket) {}

  /** Sends one JSON-RPC message. */
  send(message: unknown): void {
    this.s.send(JSON.stringify(message));
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<unknown> {
    for await (const m of this.s) {
      if (m.text !== undefined) yield JSON.parse(m.text);
    }
  }

  /** How the session ended (the close frame says why). */
  get closed(): Promise<{ code: number; reason: string }> {
    return this.s.closed;
  }

  close(): void {
    this.s.close();
  }
}
