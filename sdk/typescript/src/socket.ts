// WebSockets: `ws` on Node (it sends the bearer token and reaches Unix
// sockets), the platform's WebSocket elsewhere (a browser cannot set an
// Authorization header on a WebSocket: it needs a same-origin proxy that
// adds the token; the SDK then sends none).

import { ConnectionError, CorralError, DeadlineError } from "./errors.js";
import { Deadline, Endpoint, errorFromBody } from "./transport.js";

const isNode = typeof process !== "undefined" && typeof process.versions?.node === "string";

/** One message: text, or binary data. */
export type Message = { text: string; data?: undefined } | { text?: undefined; data: Uint8Array };

/** How a socket ended. */
export interface Closed {
  code: number;
  reason: string;
}

// Messages queued beyond this pause the socket (Node), so that a consumer
// that does not read holds the daemon's output rather than the client's
// memory.
const highWater = 64;

/**
 * Socket is an open WebSocket read as an async iterator of messages. The
 * iterator ends when the socket closes normally; an abnormal close (the
 * connection broke: code 1006) throws a ConnectionError.
 */
export class Socket {
  private readonly queue: Message[] = [];
  private waiter: (() => void) | undefined;
  private ended: Closed | undefined;
  private failure: CorralError | undefined;
  private readonly closedPromise: Promise<Closed>;
  private resolveClosed!: (c: Closed) => void;

  private constructor(
    private readonly what: string,
    private readonly sendImpl: (d: string | Uint8Array) => void,
    private readonly closeImpl: (code: number, reason: string) => void,
    private readonly pause: () => void,
    private readonly resume: () => void,
    private readonly terminate: () => void,
  ) {
    this.closedPromise = new Promise((r) => (this.resolveClosed = r));
  }

  /** Resolves once the socket is closed, with its close code and reason. */
  get closed(): Promise<Closed> {
    return this.closedPromise;
  }

  /** Sends a text (string) or binary (Uint8Array) message. */
  send(data: string | Uint8Array): void {
    if (this.ended) throw this.failure ?? new ConnectionError("transport", `corral: ${this.what}: the socket is closed`);
    this.sendImpl(data);
  }

  /** Closes the socket (1000 by default). */
  close(code = 1000, reason = ""): void {
    if (!this.ended) this.closeImpl(code, reason);
  }

  /**
   * Starts pinging the daemon (Node): the socket fails with a DeadlineError
   * when a ping goes unanswered until the next. The daemon answers pings
   * only while it reads the socket, which a session does from its
   * "started" on.
   */
  startKeepalive: () => void = () => {};

  /** Ends the socket at once (no closing handshake): its reads throw `err`. */
  fail(err: CorralError): void {
    if (this.ended) return;
    this.end({ code: 1006, reason: err.message }, err);
    this.terminate();
  }

  /** The next message, or undefined once the socket closed normally. */
  async next(): Promise<Message | undefined> {
    for (;;) {
      const m = this.queue.shift();
      if (m) {
        if (this.queue.length === highWater / 2) this.resume();
        return m;
      }
      if (this.failure) throw this.failure;
      if (this.ended) return undefined;
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Message> {
    for (;;) {
      const m = await this.next();
      if (!m) return;
      yield m;
    }
  }

  private push(m: Message): void {
    this.queue.push(m);
    if (this.queue.length === highWater) this.pause();
    this.wake();
  }

  private end(c: Closed, err?: CorralError): void {
    if (this.ended) return;
    this.ended = c;
    if (err) this.failure = err;
    else if (c.code === 1006) this.failure = new ConnectionError("transport", `corral: ${this.what}: the connection to the daemon broke`);
    this.resolveClosed(c);
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  /**
   * Opens a WebSocket to `path` (with its query). An error answer before the
   * upgrade is its CorralError; a failure to connect is a ConnectionError;
   * the deadline bounds the opening only.
   */
  static async open(ep: Endpoint, path: string, token: string, what: string, deadline: Deadline, keepaliveMs: number): Promise<Socket> {
    if (deadline.signal.aborted) throw deadline.error(what, undefined);
    if (isNode) return openNode(ep, path, token, what, deadline, keepaliveMs);
    return openStandard(ep, path, token, what, deadline);
  }

  /** @internal */
  static make(
    what: string,
    send: (d: string | Uint8Array) => void,
    close: (code: number, reason: string) => void,
    pause: () => void,
    resume: () => void,
    terminate: () => void,
  ): { socket: Socket; push: (m: Message) => void; end: (c: Closed, err?: CorralError) => void } {
    const s = new Socket(what, send, close, pause, resume, terminate);
    return { socket: s, push: (m) => s.push(m), end: (c, err) => s.end(c, err) };
  }
}

async function openNode(ep: Endpoint, path: string, token: string, what: string, deadline: Deadline, keepaliveMs: number): Promise<Socket> {
  const { WebSocket } = await import("ws");
  const url = ep.kind === "unix" ? `ws+unix://${ep.socketPath}:${path}` : ep.base.replace(/^http/, "ws") + path;
  const headers: Record<string, string> = {};
  if (token) headers["Authorization"] = `Bearer ${token}`;
  const ws = new WebSocket(url, { headers, maxPayload: 64 << 20, perMessageDeflate: false });
  // Keepalive: a ping every keepaliveMs; a daemon that answered none by the
  // next one (while the client was reading: a paused socket holds the pong
  // behind the output) is gone, and the socket fails with a DeadlineError.
  let paused = false;
  let unanswered = false;
  let keepalive: ReturnType<typeof setInterval> | undefined;
  const { socket, push, end } = Socket.make(
    what,
    (d) => ws.send(d, { binary: typeof d !== "string" }),
    (code, reason) => ws.close(code, reason),
    () => {
      paused = true;
      ws.pause();
    },
    () => {
      paused = false;
      unanswered = false;
      ws.resume();
    },
    () => ws.terminate(),
  );
  ws.on("pong", () => (unanswered = false));
  ws.on("close", () => clearInterval(keepalive));
  socket.startKeepalive = () => {
    if (keepalive !== undefined || !(keepaliveMs > 0 && Number.isFinite(keepaliveMs))) return;
    keepalive = setInterval(() => {
      if (paused) return;
      if (unanswered) {
        clearInterval(keepalive);
        socket.fail(new DeadlineError("timeout", `corral: ${what}: the daemon answered no ping within ${keepaliveMs} ms`));
        return;
      }
      unanswered = true;
      ws.ping();
    }, keepaliveMs);
  };
  return new Promise<Socket>((resolve, reject) => {
    let opened = false;
    const onAbort = () => {
      ws.terminate();
      reject(deadline.error(what, undefined));
    };
    deadline.signal.addEventListener("abort", onAbort, { once: true });
    ws.on("unexpected-response", (req, res) => {
      deadline.signal.removeEventListener("abort", onAbort);
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        req.destroy();
        const ra = res.headers["retry-after"];
        const retryAfter = typeof ra === "string" && /^\d+$/.test(ra) ? Number(ra) : undefined;
        reject(errorFromBody(Buffer.concat(chunks).toString("utf8"), res.statusCode ?? 0, false, retryAfter));
      });
      res.on("error", (err) => reject(deadline.error(what, err)));
    });
    ws.on("open", () => {
      opened = true;
      deadline.signal.removeEventListener("abort", onAbort);
      resolve(socket);
    });
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      if (isBinary) push({ data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) });
      else push({ text: data.toString("utf8") });
    });
    ws.on("error", (err) => {
      if (!opened) {
        deadline.signal.removeEventListener("abort", onAbort);
        reject(deadline.error(what, err));
      } else {
        end({ code: 1006, reason: err.message }, deadline.error(what, err));
      }
    });
    ws.on("close", (code, reason) => end({ code, reason: reason.toString("utf8") }));
  });
}

async function openStandard(ep: Endpoint, path: string, token: string, what: string, deadline: Deadline): Promise<Socket> {
  if (ep.kind === "unix") throw new CorralError("unsupported", "corral: unix:// URLs need Node");
  if (token) {
    throw new CorralError(
      "unsupported",
      `corral: ${what}: a browser cannot send a bearer token on a WebSocket; connect through a same-origin proxy that adds it, and give the client no token`,
    );
  }
  const ws = new WebSocket(ep.base.replace(/^http/, "ws") + path);
  ws.binaryType = "arraybuffer";
  const { socket, push, end } = Socket.make(
    what,
    (d) => ws.send(d as string | ArrayBufferView<ArrayBuffer>),
    (code, reason) => ws.close(code, reason),
    () => {},
    () => {},
    () => ws.close(),
  );
  return new Promise<Socket>((resolve, reject) => {
    let opened = false;
    const onAbort = () => {
      ws.close();
      reject(deadline.error(what, undefined));
    };
    deadline.signal.addEventListener("abort", onAbort, { once: true });
    ws.onopen = () => {
      opened = true;
      deadline.signal.removeEventListener("abort", onAbort);
      resolve(socket);
    };
    ws.onmessage = (ev) => {
      if (typeof ev.data === "string") push({ text: ev.data });
      else push({ data: new Uint8Array(ev.data as ArrayBuffer) });
    };
    ws.onerror = () => {
      if (!opened) {
        deadline.signal.removeEventListener("abort", onAbort);
        reject(new ConnectionError("transport", `corral: ${what}: the WebSocket failed to open`));
      }
    };
    ws.onclose = (ev) => end({ code: ev.code, reason: ev.reason });
  });
}
