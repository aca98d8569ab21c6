// The one way every part of the SDK talks to the daemon.

import { Socket } from "./socket.js";
import { Deadline, Endpoint, errorFromResponse, send } from "./transport.js";
import type { CallOptions } from "./types.js";

/** Query parameters: repeated for arrays, left out when undefined. */
export type Query = Record<string, string | number | boolean | string[] | undefined>;

export interface RequestOptions {
  query?: Query;
  /** A JSON body. */
  json?: unknown;
  /** A raw body (sent as application/octet-stream unless headers say otherwise). */
  body?: Uint8Array | string | ReadableStream<Uint8Array>;
  headers?: Record<string, string>;
  /** Error bodies carry base64 output (a command asked for encoding base64). */
  base64Output?: boolean;
  /** The deadline to use when not the call's own (run computes one). */
  deadlineMs?: number;
  /** Answer the Response whatever its status (a site's answer). */
  anyStatus?: boolean;
}

/** An open answer: its Response (2xx) and the call's deadline, to release with `done()`. */
export interface Opened {
  res: Response;
  deadline: Deadline;
  what: string;
}

/** Caller is the Corral client as its parts see it. */
export class Caller {
  constructor(
    readonly endpoint: Endpoint,
    readonly token: string,
    readonly deadlineMs: number,
    private readonly fetchImpl: typeof fetch | undefined,
    readonly keepaliveMs: number,
  ) {}

  /** Opens a request: its answer once a 2xx status arrived; any other is thrown as its CorralError. */
  async open(method: string, path: string, o: RequestOptions, call: CallOptions = {}): Promise<Opened> {
    const what = `${method} ${path}`;
    const deadline = new Deadline(what, call.deadlineMs ?? o.deadlineMs ?? this.deadlineMs, call.signal);
    const headers: Record<string, string> = { ...o.headers };
    if (this.token) headers["Authorization"] = `Bearer ${this.token}`;
    let body = o.body;
    if (o.json !== undefined) {
      body = JSON.stringify(o.json);
      headers["Content-Type"] = "application/json";
    } else if (body !== undefined && !headers["Content-Type"]) {
      headers["Content-Type"] = "application/octet-stream";
    }
    try {
      const res = await send(this.endpoint, { method, path: path + queryString(o.query), headers, body, signal: deadline.signal }, this.fetchImpl);
      if (!o.anyStatus && (res.status < 200 || res.status > 299)) throw await errorFromResponse(res, o.base64Output);
      return { res, deadline, what };
    } catch (err) {
      deadline.done();
      throw deadline.error(what, err);
    }
  }

  /** Sends a request and decodes its JSON answer (undefined for an empty one). */
  async json<T>(method: string, path: string, o: RequestOptions = {}, call: CallOptions = {}): Promise<T> {
    const { res, deadline, what } = await this.open(method, path, o, call);
    try {
      const text = await res.text();
      return (text === "" ? undefined : JSON.parse(text)) as T;
    } catch (err) {
      throw deadline.error(what, err);
    } finally {
      deadline.done();
    }
  }

  /**
   * Opens a WebSocket; the call's deadline bounds the opening. Its
   * keepalive starts at once unless `keepaliveLater` (see
   * Socket.startKeepalive).
   */
  async socket(path: string, query: Query, what: string, call: CallOptions = {}, keepaliveLater = false): Promise<Socket> {
    const deadline = new Deadline(what, call.deadlineMs ?? this.deadlineMs, call.signal);
    try {
      const s = await Socket.open(this.endpoint, path + queryString(query), this.token, what, deadline, this.keepaliveMs);
      if (!keepaliveLater) s.startKeepalive();
      if (call.signal) {
        const onAbort = () => s.close(1000, "aborted");
        call.signal.addEventListener("abort", onAbort, { once: true });
        void s.closed.then(() => call.signal?.removeEventListener("abort", onAbort));
      }
      return s;
    } finally {
      deadline.done();
    }
  }
}

export function queryString(q: Query | undefined): string {
  if (!q) return "";
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) for (const x of v) p.append(k, x);
    else p.append(k, String(v));
  }
  const s = p.toString();
  return s ? "?" + s : "";
}

/** "/v1/projects/{id}" and the escaped segments. */
export function projectPath(id: number, ...segments: string[]): string {
  return `/v1/projects/${id}` + segments.map((s) => "/" + encodeURIComponent(s)).join("");
}

/** A command's environment as the sessions' K=V query parameters, sorted. */
export function envQuery(env: Record<string, string> | undefined): string[] | undefined {
  if (!env) return undefined;
  return Object.keys(env)
    .sort()
    .map((k) => `${k}=${env[k]}`);
}
