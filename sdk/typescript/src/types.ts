// The API's objects as docs/openapi.json describes them. Times are RFC 3339
// strings as the daemon sends them.

/** Every call takes these: the caller's cancellation and the client-side deadline. */
export interface CallOptions {
  /** Aborts the call (an AbortError); a running command is cancelled. */
  signal?: AbortSignal;
  /**
   * Milliseconds the call may take before it fails with a DeadlineError
   * (default: the client's `deadlineMs`, 60 s; 0 for none). For calls that
   * open a stream (output that follows, watches, sessions, file reads as
   * streams) it bounds the opening; the stream then lasts until it ends,
   * is closed, or `signal` aborts it.
   */
  deadlineMs?: number;
}

export interface Account {
  id: number;
  name: string;
  created: string;
}

export interface Token {
  id: number;
  accountId: number;
  name: string;
  /** The token itself: shown only this once. */
  token: string;
}

/** One of the machines' images in the daemon's store (listImages, pullImage). */
export interface Image {
  name: string;
  /** The config digest (sha256:…). */
  id: string;
  /** The manifest digest a registry serves it by (pulled images). */
  digest?: string;
  /** The reference, archive or directory it came from. */
  source?: string;
  created: string;
  /** Bytes of file content of its layers. */
  size: number;
  layers: number;
  /** What machines apply: the default user, env under a request's, default cwd, entrypoint and cmd. */
  config: { user?: string; env?: string[]; working_dir?: string; entrypoint?: string[]; cmd?: string[] };
}

export interface Health {
  status?: string;
  sandbox?: string;
  worker?: string;
  [k: string]: unknown;
}

/** A machine's resource limits: zero means the daemon's default. */
export interface Limits {
  /** Bytes. */
  memory?: number;
  pids?: number;
  /** Thousandths of a CPU. */
  cpuMillis?: number;
  /** Bytes. */
  disk?: number;
  /** Bytes of /tmp and /dev/shm. */
  tmp?: number;
}

/** A managed project's machine: its image and limits. */
export interface Machine {
  image?: string;
  limits?: Limits;
}

export interface ProjectInfo {
  id: number;
  name: string;
  kind: "managed" | "host";
  /** A host project's directory. */
  root?: string;
  created: string;
  /** The caller's role. */
  role?: "owner" | "member";
  machine?: Machine;
}

export interface ProjectRequest {
  /** [A-Za-z0-9_][A-Za-z0-9._-]{0,63}. */
  name: string;
  /** "managed" (default) or "host". */
  kind?: "managed" | "host";
  /** A host project's directory. */
  root?: string;
  /** A host directory to copy the workspace from. */
  from?: string;
  /** A Git URL to clone the workspace from. */
  git?: string;
  /** The remotes exports of this project may push to (within the daemon's --export-remote). */
  exportRemotes?: string[];
}

export interface Member {
  accountId: number;
  account?: string;
  role: "owner" | "member";
  trusted: boolean;
  created: string;
}

export interface MemberRequest {
  account: string;
  role?: "owner" | "member";
  trusted?: boolean;
}

export interface EgressPolicy {
  mode: "none" | "proxy";
  allow?: string[];
  deny?: string[];
}

export interface EgressLogEntry {
  id: number;
  account: number;
  protocol: "http" | "connect" | "socks5";
  name: string;
  addr: string;
  port: number;
  verdict: "allowed" | "denied" | "failed";
  rule: string;
  error?: string;
  bytesIn: number;
  bytesOut: number;
  startedAt: string;
  durationMs: number;
}

export interface Site {
  name: string;
  projectId: number;
  port: number;
  publishedBy: number;
  published: string;
}

export interface SiteURL {
  url: string;
  expires: string;
}

export interface ExportRequest {
  remote: string;
  branch: string;
  expectedHead: string;
}

export interface ExportResult {
  pushed: boolean;
  head: string;
  remote: string;
  [k: string]: unknown;
}

/** Output limits of a command, in bytes (zero: the daemon's default, 64 MiB a stream). */
export interface OutputLimits {
  stdout?: number;
  stderr?: number;
  combined?: number;
}

/** How a command or process ended. */
export interface Exit {
  /** The exit code, or null when a signal killed it. */
  code: number | null;
  /** The signal that killed it ("SIGKILL"), or null. */
  signal: string | null;
  /** True when the kernel's OOM killer killed it (its machine hit its memory limit). */
  oomKilled: boolean;
}

/** A file as stat and list describe it. */
export interface FileInfo {
  name: string;
  path: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  /** Octal permission bits, "0644". */
  mode: string;
  mtime: string;
  /** A symlink's target. */
  target?: string;
}

export interface FileList {
  dir: FileInfo;
  entries: FileInfo[];
  /** True when the listing stopped at its limit. */
  truncated: boolean;
}

/** One event of a watch, in the kernel's order. */
export interface FileEvent {
  type: "create" | "modify" | "delete" | "rename" | "overflow";
  path?: string;
  /** A rename's old path. */
  from?: string;
  isDir?: boolean;
}

export interface ProcessInfo {
  id: string;
  projectId: number;
  state: "running" | "exited" | "killed" | "timedOut" | "interrupted" | "failed";
  argv: string[];
  cwd?: string;
  user?: string;
  tty?: boolean;
  leaseId?: string;
  started: string;
  ended: string | null;
  deadline: string;
  output: { stdoutBytes: number; stderrBytes: number; start: number; end: number; bufferBytes: number };
  exit: { code: number | null; signal: string | null; oomKilled?: boolean } | null;
  error: { kind: string; message: string } | null;
}

/** The last line of a process's output: where to continue, and its state. */
export interface ProcessOutputEnd {
  /** The offset to continue from. */
  offset: number;
  state: string;
  exit: { code: number | null; signal: string | null; oomKilled?: boolean } | null;
  error: { kind: string; message: string } | null;
}

/**
 * One chunk of live output. `data` is the raw bytes; `text` is the text of
 * the complete UTF-8 characters so far in its stream that no earlier chunk
 * carried: a character split across chunks is held back, then given whole.
 */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: Uint8Array;
  text: string;
  /** A background process's output: the offset of `data` in the combined output. */
  offset?: number;
}
