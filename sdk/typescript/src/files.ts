// A project's files: guest paths (/workspace/x, /home/corral/y, or relative
// to the workspace), resolved inside the machine as a user of it.

import { Caller, projectPath } from "./caller.js";
import { ProtocolError } from "./errors.js";
import { bytesOf, concat, utf8 } from "./output.js";
import type { Socket } from "./socket.js";
import type { CallOptions, FileEvent, FileInfo, FileList } from "./types.js";

export interface FileOptions extends CallOptions {
  /** Managed projects: whom to act as (a user name or uid of the machine; default the image's user). */
  user?: string;
}

/** A file being read: its bytes as a stream, and what the answer said about it. */
export interface FileStream {
  stream: ReadableStream<Uint8Array>;
  /** Its size in bytes (Content-Length). */
  size: number;
  /** Octal permission bits (X-Corral-Mode). */
  mode: string | undefined;
  /** Last-Modified. */
  modified: string | undefined;
}

export type FileData = Uint8Array | string | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** A project's files. */
export class Files {
  constructor(
    private readonly c: Caller,
    readonly projectId: number,
  ) {}

  private p(...rest: string[]): string {
    return projectPath(this.projectId, "files", ...rest);
  }

  /** Reads a whole file's bytes (getFile). */
  async read(path: string, o: FileOptions = {}): Promise<Uint8Array> {
    const { res, deadline, what } = await this.c.open("GET", this.p(), { query: { path, user: o.user } }, o);
    try {
      return new Uint8Array(await res.arrayBuffer());
    } catch (err) {
      throw deadline.error(what, err);
    } finally {
      deadline.done();
    }
  }

  /** Reads a whole file as UTF-8 text. */
  async readText(path: string, o: FileOptions = {}): Promise<string> {
    return utf8.decode(await this.read(path, o));
  }

  /**
   * Opens a file for reading as a stream (getFile): the deadline bounds the
   * opening; a connection that breaks while it streams errors the stream
   * with a ConnectionError.
   */
  async readStream(path: string, o: FileOptions = {}): Promise<FileStream> {
    const { res, deadline, what } = await this.c.open("GET", this.p(), { query: { path, user: o.user } }, o);
    deadline.stopTimer();
    const reader = res.body!.getReader();
    const stream = new ReadableStream<Uint8Array>({
      async pull(ctl) {
        try {
          const { done, value } = await reader.read();
          if (done) {
            deadline.done();
            ctl.close();
          } else ctl.enqueue(value);
        } catch (err) {
          deadline.done();
          ctl.error(deadline.error(what, err));
        }
      },
      async cancel(reason) {
        deadline.done();
        await reader.cancel(reason);
      },
    });
    return {
      stream,
      size: Number(res.headers.get("content-length") ?? NaN),
      mode: res.headers.get("x-corral-mode") ?? undefined,
      modified: res.headers.get("last-modified") ?? undefined,
    };
  }

  /**
   * Replaces a file with `data` (putFile): bytes, text (UTF-8), a stream or
   * an async iterable of bytes. Readers see the old file or the whole new
   * one. `mode` is its permission bits (default 0o644); `mkdirs` makes the
   * missing directories above it (as `mkdir -p`, as the user), else a
   * missing directory is a NotFoundError.
   */
  async write(path: string, data: FileData, o: FileOptions & { mode?: number; mkdirs?: boolean } = {}): Promise<FileInfo> {
    const mode = o.mode === undefined ? undefined : o.mode.toString(8).padStart(4, "0");
    let body: Uint8Array | ReadableStream<Uint8Array>;
    if (typeof data === "string" || data instanceof Uint8Array) body = bytesOf(data);
    else if (data instanceof ReadableStream) body = data;
    else body = iterableStream(data);
    return this.c.json<FileInfo>("PUT", this.p(), { query: { path, mode, user: o.user, mkdirs: o.mkdirs ? "1" : undefined }, body }, o);
  }

  /** Describes a file; a final symlink is described, not followed (statFile). */
  async stat(path: string, o: FileOptions = {}): Promise<FileInfo> {
    return this.c.json<FileInfo>("GET", this.p("stat"), { query: { path, user: o.user } }, o);
  }

  /** Lists a directory, name order, depth first (listFiles). */
  async list(path = "/workspace", o: FileOptions & { depth?: number; limit?: number } = {}): Promise<FileList> {
    return this.c.json<FileList>("GET", this.p("list"), { query: { path, depth: o.depth, limit: o.limit, user: o.user } }, o);
  }

  /** Makes a directory (makeDirectory); `parents` makes the missing ones above it too. */
  async mkdir(path: string, o: FileOptions & { mode?: number; parents?: boolean } = {}): Promise<FileInfo> {
    const body: Record<string, unknown> = { path };
    if (o.mode !== undefined) body.mode = o.mode.toString(8).padStart(4, "0");
    if (o.parents) body.parents = true;
    if (o.user !== undefined) body.user = o.user;
    return this.c.json<FileInfo>("POST", this.p("mkdir"), { json: body }, o);
  }

  /** Removes a file, symlink or directory (removeFile); a non-empty directory needs `recursive`. */
  async remove(path: string, o: FileOptions & { recursive?: boolean } = {}): Promise<void> {
    const body: Record<string, unknown> = { path };
    if (o.recursive) body.recursive = true;
    if (o.user !== undefined) body.user = o.user;
    await this.c.json<void>("POST", this.p("remove"), { json: body }, o);
  }

  /** Renames a file; one at the destination is replaced (renameFile). */
  async rename(from: string, to: string, o: FileOptions = {}): Promise<void> {
    const body: Record<string, unknown> = { from, to };
    if (o.user !== undefined) body.user = o.user;
    await this.c.json<void>("POST", this.p("rename"), { json: body }, o);
  }

  /**
   * Watches a directory (watchFiles): the events in the kernel's order. The
   * watch is in place once this resolves. `close()` ends it.
   */
  async watch(path = "/workspace", o: FileOptions & { recursive?: boolean } = {}): Promise<FileWatch> {
    const s = await this.c.socket(this.p("watch"), { path, recursive: o.recursive ? "1" : undefined, user: o.user }, "watch " + path, o);
    return new FileWatch(s);
  }
}

/** A watch: an async iterable of FileEvents until it is closed. */
export class FileWatch implements AsyncIterable<FileEvent> {
  constructor(private readonly s: Socket) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<FileEvent> {
    try {
      for await (const m of this.s) {
        if (m.text === undefined) throw new ProtocolError("protocol", "corral: watch: a binary message");
        yield JSON.parse(m.text) as FileEvent;
      }
    } finally {
      this.close();
    }
  }

  /** Ends the watch. */
  close(): void {
    this.s.close();
  }
}

function iterableStream(it: AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const iter = it[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      const { done, value } = await iter.next();
      if (done) ctl.close();
      else ctl.enqueue(value);
    },
    async cancel() {
      await iter.return?.();
    },
  });
}

/** Joins the chunks of a byte stream. */
export async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return concat(parts);
    parts.push(value);
  }
}
