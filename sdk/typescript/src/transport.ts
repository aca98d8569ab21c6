// The HTTP and WebSocket transports: fetch for http(s) URLs, node:http over
// a Unix socket for unix:// URLs (Node only), `ws` for WebSockets on Node and
// the platform's WebSocket elsewhere. Every call runs under a Deadline, a
// signal that aborts when the caller's signal does or the call's
// client-side deadline passes.

import { AbortError, ConnectionError, CorralError, DeadlineError, errorFor, ProtocolError } from "./errors.js";

const isNode = typeof process !== "undefined" && typeof process.versions?.node === "string";

/** Where the daemon is: an http(s) base URL, or a Unix socket path. */
export type Endpoint = { kind: "http"; base: string } | { kind: "unix"; socketPath: string };

/** Parses CORRAL_URL's forms: http(s)://host:port[/prefix] and unix:///path/to/corral.sock. */
export function parseEndpoint(url: string): Endpoint {
  if (url.startsWith("unix://")) {
    const socketPath = decodeURIComponent(url.slice("unix://".length));
    if (!socketPath.startsWith("/")) {
      throw new CorralError("invalid", `corral: a unix URL names an absolute socket path (unix:///path), not ${JSON.stringify(url)}`);
    }
    return { kind: "unix", socketPath };
  }
  if (url.startsWith("http://") || url.startsWith("https://")) {
    return { kind: "http", base: url.replace(/\/+$/, "") };
  }
  throw new CorralError("invalid", `corral: the daemon's URL is http(s)://host:port or unix:///path/to/corral.sock, not ${JSON.stringify(url)}`);
}

/**
 * A Deadline is one call's cancellation: it aborts when the caller's signal
 * does (an AbortError) or after `ms` milliseconds (a DeadlineError). `ms` 0
 * or Infinity means no deadline. `done()` releases its timer.
 */
export class Deadline {
  readonly signal: AbortSignal;
  private readonly ctl = new AbortController();
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly unlisten: () => void;

  constructor(what: string, ms: number, signal?: AbortSignal) {
    this.signal = this.ctl.signal;
    if (ms > 0 && Number.isFinite(ms)) {
      this.timer = setTimeout(() => this.ctl.abort(new DeadlineError("timeout", `corral: ${what}: no answer within the client's deadline of ${ms} ms`)), ms);
    }
    const onAbort = () => this.ctl.abort(new AbortError("abort", `corral: ${what}: aborted by the caller`, { cause: signal?.reason }));
    if (signal?.aborted) onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });
    this.unlisten = () => signal?.removeEventListener("abort", onAbort);
  }

  /** Stops the deadline's timer (the call is past the part it bounds). */
  stopTimer(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Ends the call with `err`: its request is aborted, and the call fails with it. */
  fail(err: CorralError): void {
    if (!this.signal.aborted) this.ctl.abort(err);
  }

  /** Ends the call: its request is aborted (a no-op once it completed). */
  cancel(): void {
    if (!this.signal.aborted) this.ctl.abort(new AbortError("abort", "corral: the call was closed"));
  }

  /** Releases the deadline: its timer and its listener on the caller's signal. */
  done(): void {
    this.stopTimer();
    this.unlisten();
  }

  /**
   * The error to throw for `err`, caught during the call: the deadline's or
   * the caller's abort if it fired, else a ConnectionError for a failure of
   * the connection. CorralErrors pass through.
   */
  error(what: string, err: unknown, partial?: { stdout?: Uint8Array; stderr?: Uint8Array }): CorralError {
    if (this.signal.aborted) {
      const r = this.signal.reason as CorralError;
      if (partial && (partial.stdout?.length || partial.stderr?.length)) {
        return new (r.constructor as typeof CorralError)(r.kind, r.message, { status: r.status, cause: r.cause, reason: r.reason, ...partial });
      }
      return r;
    }
    if (err instanceof CorralError) return err;
    return new ConnectionError("transport", `corral: ${what}: ${describe(err)}`, { cause: err, ...partial });
  }
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const c = (err as { cause?: unknown }).cause;
    if (c instanceof Error && c.message && c.message !== err.message) return `${err.message}: ${c.message}`;
    return err.message;
  }
  return String(err);
}

/** One HTTP request. */
export interface HTTPRequest {
  method: string;
  /** The path and query, starting with "/". */
  path: string;
  headers: Record<string, string>;
  body?: Uint8Array | string | ReadableStream<Uint8Array>;
  signal: AbortSignal;
}

/** Sends one request and answers the daemon's Response (any status). */
export async function send(ep: Endpoint, req: HTTPRequest, fetchImpl?: typeof fetch): Promise<Response> {
  if (ep.kind === "unix") return sendUnix(ep.socketPath, req);
  // Redirects are answered, not followed, as over a Unix socket (a site's
  // /sites/{name} redirects to its root; in a browser that answer is opaque).
  const init: RequestInit & { duplex?: string } = { method: req.method, headers: req.headers, signal: req.signal, redirect: "manual" };
  if (req.body !== undefined) {
    init.body = req.body as BodyInit;
    if (req.body instanceof ReadableStream) init.duplex = "half";
  }
  return (fetchImpl ?? fetch)(ep.base + req.path, init);
}

async function sendUnix(socketPath: string, req: HTTPRequest): Promise<Response> {
  if (!isNode) throw new CorralError("unsupported", "corral: unix:// URLs need Node (node:http over a Unix socket)");
  const http = await import("node:http");
  const { Readable } = await import("node:stream");
  return new Promise<Response>((resolve, reject) => {
    const r = http.request({ socketPath, path: req.path, method: req.method, headers: req.headers, signal: req.signal }, (res) => {
      const headers = new Headers();
      for (const [k, v] of Object.entries(res.headers)) {
        if (Array.isArray(v)) for (const x of v) headers.append(k, x);
        else if (v !== undefined) headers.set(k, v);
      }
      const status = res.statusCode ?? 0;
      const nullBody = status === 204 || status === 304 || req.method === "HEAD";
      // A response that ends before its length (the daemon died) errors its
      // stream: node:http says "aborted" on the message.
      res.on("aborted", () => res.destroy(new Error("the connection closed before the answer ended")));
      const body = nullBody ? null : (Readable.toWeb(res) as unknown as ReadableStream<Uint8Array>);
      if (nullBody) res.resume();
      // Response refuses statuses outside 200–599; the daemon sends none.
      resolve(new Response(body, { status: status < 200 || status > 599 ? 502 : status, statusText: res.statusMessage, headers }));
    });
    r.on("error", reject);
    const b = req.body;
    if (b === undefined) {
      r.end();
    } else if (typeof b === "string" || b instanceof Uint8Array) {
      r.end(b);
    } else {
      (async () => {
        const reader = b.getReader();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          if (!r.write(value)) await new Promise((ok) => r.once("drain", ok));
        }
        r.end();
      })().catch((err) => r.destroy(err));
    }
  });
}

/** Reads an error answer (any non-2xx status) as its CorralError. */
export async function errorFromResponse(res: Response, base64Output = false): Promise<CorralError> {
  const text = await res.text();
  let retryAfter: number | undefined;
  const ra = res.headers.get("retry-after");
  if (ra !== null && /^\d+$/.test(ra.trim())) retryAfter = Number(ra.trim());
  return errorFromBody(text, res.status, base64Output, retryAfter);
}

/** Builds the CorralError of an error body `{"error":{kind,message,stdout,stderr}}`. */
export function errorFromBody(text: string, status: number, base64Output: boolean, retryAfter?: number): CorralError {
  let body: { error?: { kind?: unknown; message?: unknown; stdout?: unknown; stderr?: unknown; reason?: unknown } } | undefined;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  const e = body?.error;
  if (!e || typeof e.kind !== "string") {
    const msg = text.trim().slice(0, 512) || `HTTP ${status}`;
    return errorFor(kindOfStatus(status), `corral: ${status}: ${msg}`, { status, retryAfter });
  }
  const out = (s: unknown) => (typeof s !== "string" || s === "" ? new Uint8Array(0) : base64Output ? fromBase64(s) : new TextEncoder().encode(s));
  const reason = typeof e.reason === "string" ? e.reason : undefined;
  return errorFor(e.kind, String(e.message ?? ""), { status, retryAfter, reason, stdout: out(e.stdout), stderr: out(e.stderr) });
}

// kindOfStatus names the kind of an error answer without the error body
// (a proxy's answer, say).
function kindOfStatus(status: number): string {
  switch (status) {
    case 400:
    case 415:
      return "invalid";
    case 401:
      return "unauthorized";
    case 403:
      return "forbidden";
    case 404:
      return "notFound";
    case 409:
      return "conflict";
    case 413:
      return "requestTooLarge";
    case 429:
      return "busy";
    case 502:
      return "badGateway";
    case 503:
      return "unavailable";
    default:
      return "internal";
  }
}

export function fromBase64(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export function toBase64(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

/**
 * Lines splits a byte stream into lines ("\n"-terminated, the terminator
 * dropped); a last line without its "\n" is yielded too.
 */
export async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const dec = new TextDecoder();
  const reader = body.getReader();
  let buf = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.trim() !== "") yield line;
      }
    }
    buf += dec.decode();
    if (buf.trim() !== "") yield buf;
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => {});
  }
}

/** Parses one line of a JSON stream. */
export function parseLine(what: string, line: string): Record<string, unknown> {
  try {
    const v = JSON.parse(line);
    if (v && typeof v === "object" && !Array.isArray(v)) return v;
  } catch {
    // below
  }
  throw new ProtocolError("protocol", `corral: ${what}: a line that is not a JSON object: ${line.slice(0, 200)}`);
}
