// Background processes: started and held by the daemon, their output kept
// in a ring and replayed from any offset it still holds.

import { Caller, projectPath } from "./caller.js";
import { ConnectionError, DeadlineError, ProtocolError } from "./errors.js";
import { ChunkDecoder } from "./output.js";
import { Deadline, fromBase64, lines, parseLine } from "./transport.js";
import type { CallOptions, OutputChunk, ProcessInfo, ProcessOutputEnd } from "./types.js";

export interface StartOptions extends CallOptions {
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  /** Run it on a terminal of this size (all output then comes as stdout). */
  tty?: { rows?: number; cols?: number };
  /** Seconds it may run (default 1 h, at most 24 h): then it is killed, state timedOut. */
  lifetime?: number;
  /** Bytes of output the daemon keeps (default 1 MiB, at most 16 MiB; the newest are kept). */
  outputBuffer?: number;
}

export interface OutputOptions extends CallOptions {
  /** The offset in the combined output to start from (default 0). An offset that fell off the ring starts where it starts. */
  since?: number;
  /** Follow new output until the process ended (default true); false ends with what is there. */
  follow?: boolean;
}

/** A project's background processes. */
export class Processes {
  constructor(
    private readonly c: Caller,
    readonly projectId: number,
  ) {}

  /** Starts `argv` as a background process (startProcess). */
  async start(argv: string[], o: StartOptions = {}): Promise<Process> {
    const body: Record<string, unknown> = { argv };
    for (const k of ["env", "cwd", "user", "tty", "lifetime", "outputBuffer"] as const) {
      if (o[k] !== undefined) body[k] = o[k];
    }
    const info = await this.c.json<ProcessInfo>("POST", projectPath(this.projectId, "processes"), { json: body }, o);
    return new Process(this.c, info);
  }

  /** The running processes and the ended ones still kept, oldest first (listProcesses). */
  async list(o: CallOptions = {}): Promise<Process[]> {
    const v = await this.c.json<{ processes: ProcessInfo[] }>("GET", projectPath(this.projectId, "processes"), {}, o);
    return v.processes.map((p) => new Process(this.c, p));
  }

  /** One process (getProcess); a NotFoundError once it is forgotten. */
  async get(id: string, o: CallOptions = {}): Promise<Process> {
    return new Process(this.c, await this.c.json<ProcessInfo>("GET", projectPath(this.projectId, "processes", id), {}, o));
  }
}

/** A background process: its last known state (`info`) and what can be done to it. */
export class Process {
  constructor(
    private readonly c: Caller,
    /** Its state as last read; `refresh()` reads it again. */
    public info: ProcessInfo,
  ) {}

  get id(): string {
    return this.info.id;
  }

  get projectId(): number {
    return this.info.projectId;
  }

  private path(...rest: string[]): string {
    return projectPath(this.info.projectId, "processes", this.info.id, ...rest);
  }

  /** Reads its state again (getProcess). */
  async refresh(o: CallOptions = {}): Promise<ProcessInfo> {
    this.info = await this.c.json<ProcessInfo>("GET", this.path(), {}, o);
    return this.info;
  }

  /**
   * Its output from `since` (getProcessOutput): iterate the chunks (each
   * with its offset), then read `end` for where to continue and how it
   * ended. A client that stops reading and comes back later continues from
   * the offset after the last chunk it saw.
   */
  output(o: OutputOptions = {}): ProcessOutput {
    return new ProcessOutput(this.c, this.path("output"), o);
  }

  /** Follows its output to the end and answers its last state. */
  async wait(o: CallOptions = {}): Promise<ProcessOutputEnd> {
    const out = this.output({ ...o, follow: true });
    for await (const _ of out) {
      // Output is not kept here: read it with output().
    }
    return out.end!;
  }

  /** Sends a signal ("TERM", "INT", "KILL", …) to every process of its tree (signalProcess). */
  async signal(signal: string, o: CallOptions = {}): Promise<ProcessInfo> {
    this.info = await this.c.json<ProcessInfo>("POST", this.path("signal"), { json: { signal } }, o);
    return this.info;
  }

  /** Kills its whole tree, waits for it to end and forgets it (deleteProcess); answers its last state. */
  async kill(o: CallOptions = {}): Promise<ProcessInfo> {
    this.info = await this.c.json<ProcessInfo>("DELETE", this.path(), {}, o);
    return this.info;
  }
}

/** A process's output read from an offset: chunks, then `end`. */
export class ProcessOutput implements AsyncIterable<OutputChunk> {
  /** The last line, once the iteration ended: where to continue, state, exit. */
  end: ProcessOutputEnd | undefined;
  /** Where the retained output starts (the Corral-Output-Start header), once the answer began. */
  start: number | undefined;

  constructor(
    private readonly c: Caller,
    private readonly path: string,
    private readonly o: OutputOptions,
  ) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<OutputChunk> {
    const query = { from: this.o.since ?? 0, follow: this.o.follow === false ? "0" : "1", encoding: "base64" };
    const { res, deadline, what } = await this.c.open("GET", this.path, { query }, this.o);
    // The deadline bounds the opening; a followed output lasts as long as the
    // process. The daemon sends nothing while the process is quiet: every
    // keepaliveMs the client asks for the process (getProcess), and a daemon
    // that does not answer that in time, or is gone, ends the output with
    // that error.
    deadline.stopTimer();
    const probe = this.keepalive(deadline);
    const s = res.headers.get("corral-output-start");
    if (s !== null) this.start = Number(s);
    const dec = new ChunkDecoder();
    try {
      for await (const line of lines(res.body!)) {
        const v = parseLine(what, line);
        if (typeof v.stream === "string") {
          yield dec.chunk(v.stream as "stdout" | "stderr", fromBase64(String(v.data ?? "")), Number(v.offset));
          continue;
        }
        this.end = v as unknown as ProcessOutputEnd;
        return;
      }
      throw new ProtocolError("protocol", `corral: ${what}: the output ended without its last line`);
    } catch (err) {
      throw deadline.error(what, err);
    } finally {
      clearInterval(probe);
      deadline.cancel();
      deadline.done();
    }
  }

  private keepalive(deadline: Deadline): ReturnType<typeof setInterval> | undefined {
    const ms = this.c.keepaliveMs;
    if (!(ms > 0 && Number.isFinite(ms)) || this.o.follow === false) return undefined;
    const processPath = this.path.slice(0, -"/output".length);
    let inFlight = false;
    return setInterval(() => {
      if (inFlight) return;
      inFlight = true;
      this.c
        .json("GET", processPath, {}, { deadlineMs: ms, signal: deadline.signal })
        .catch((err) => {
          if (err instanceof DeadlineError || err instanceof ConnectionError) deadline.fail(err);
        })
        .finally(() => (inFlight = false));
    }, ms);
  }
}
