// Errors: one class per kind of the API's error body
// ({"error":{"kind","message","stdout","stderr"}}), plus the client's own
// connection and deadline errors. Every error of this SDK is a CorralError.

const utf8 = new TextDecoder();

/** What an error is built from. */
export interface CorralErrorInit {
  /** The HTTP status of the answer; 0 for an error of the client itself. */
  status?: number;
  /** The partial output of a command that started (raw bytes). */
  stdout?: Uint8Array;
  stderr?: Uint8Array;
  /** Seconds the daemon asked to wait before retrying (Retry-After). */
  retryAfter?: number;
  /** A start error's reason: "notFound" (no such program) or "notExecutable". */
  reason?: string;
  cause?: unknown;
}

/**
 * CorralError is every error the SDK throws. `kind` is the API's error kind
 * ("timeout", "forbidden", …; "connection" and "deadline" for the client's
 * own), `status` the HTTP status (0 when no answer was read), and `stdout` /
 * `stderr` the partial output of a command that did not complete.
 */
export class CorralError extends Error {
  readonly kind: string;
  readonly status: number;
  readonly stdout: Uint8Array;
  readonly stderr: Uint8Array;
  /** Seconds to wait before retrying, from Retry-After (429 answers). */
  readonly retryAfter: number | undefined;
  /** Why a program could not start, when the daemon knows: "notFound" or "notExecutable". */
  readonly reason: string | undefined;

  constructor(kind: string, message: string, init: CorralErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.kind = kind;
    this.status = init.status ?? 0;
    this.stdout = init.stdout ?? new Uint8Array(0);
    this.stderr = init.stderr ?? new Uint8Array(0);
    this.retryAfter = init.retryAfter;
    this.reason = init.reason;
  }

  /** The partial standard output as text (invalid UTF-8 becomes U+FFFD). */
  get stdoutText(): string {
    return utf8.decode(this.stdout);
  }

  /** The partial standard error as text. */
  get stderrText(): string {
    return utf8.decode(this.stderr);
  }
}

type ErrorClass = new (kind: string, message: string, init?: CorralErrorInit) => CorralError;

// Kinds of a command that did not complete (the sandbox's error kinds).

/** A refused preparation: bad environment, unknown user for a host project, an exhausted budget (429). */
export class PrepareError extends CorralError {}
/** The program could not be started (422). */
export class StartError extends CorralError {}
/** The command outlived its timeout (504), or a process its lifetime. */
export class TimeoutError extends CorralError {}
/** The command was cancelled: the client went away or aborted. */
export class AbortError extends CorralError {}
/** Output over its limit (413); the output up to the limit is kept. */
export class OverflowError extends CorralError {}
/** The link to the command was lost (502), or the client lost its connection to the daemon. */
export class TransportError extends CorralError {}
/** Cancelling or releasing the command failed (500). */
export class CleanupError extends CorralError {}

// Kinds of the API itself.

/** No bearer token, or an unknown or revoked one (401). */
export class UnauthorizedError extends CorralError {}
/** Not a member of the project (or it does not exist), or not allowed (403). */
export class ForbiddenError extends CorralError {}
/** No such project (for admins), file, process, site, account (404). */
export class NotFoundError extends CorralError {}
/** A malformed request or a bad value (400, 415). */
export class InvalidError extends CorralError {}
/** A request body over the daemon's cap (413). */
export class RequestTooLargeError extends CorralError {}
/** Exists already, or in use (409). */
export class ConflictError extends CorralError {}
/** An admission budget is exhausted (429, kind busy; also 429 prepare): retry after `retryAfter` seconds. */
export class RateLimitedError extends CorralError {}
/** A domain, the worker or the privileged transport is missing (503). */
export class UnavailableError extends CorralError {}
/** A site or remote could not be reached (502). */
export class BadGatewayError extends CorralError {}
/** An internal error of the daemon (500). */
export class InternalError extends CorralError {}
/** The project's disk is full (507); nothing was left behind. */
export class NoSpaceError extends CorralError {}
/** The project's sandbox cannot do this (501), e.g. signal a whole tree without the worker's exec-signal feature. */
export class UnsupportedError extends CorralError {}
/** Export: the branch is not at expectedHead (409). */
export class HeadMovedError extends ConflictError {}
/** Export: the remote refused the push (409). */
export class RejectedError extends ConflictError {}
/** Export: the workspace is not a Git repository (409). */
export class NotRepositoryError extends ConflictError {}
/** Export: the bundle is over the cap (413). */
export class TooLargeError extends CorralError {}
/** Git reads: no such ref or path (404). */
export class UnknownRevisionError extends NotFoundError {}

// The client's own errors.

/**
 * The connection to the daemon failed or broke mid-call (refused, reset,
 * closed before the answer ended): the daemon is gone or unreachable. Kind
 * "transport", status 0.
 */
export class ConnectionError extends TransportError {}
/** The call's client-side deadline passed before it ended. Kind "timeout", status 0. */
export class DeadlineError extends TimeoutError {}
/** The daemon answered something this SDK cannot read (kind "protocol"). */
export class ProtocolError extends CorralError {}

/**
 * ERROR_KINDS maps every error kind the API documents to its class. An
 * unknown kind is a plain CorralError carrying it.
 */
export const ERROR_KINDS: Readonly<Record<string, ErrorClass>> = Object.freeze({
  prepare: PrepareError,
  start: StartError,
  timeout: TimeoutError,
  abort: AbortError,
  overflow: OverflowError,
  transport: TransportError,
  cleanup: CleanupError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  notFound: NotFoundError,
  invalid: InvalidError,
  requestTooLarge: RequestTooLargeError,
  conflict: ConflictError,
  busy: RateLimitedError,
  unavailable: UnavailableError,
  badGateway: BadGatewayError,
  internal: InternalError,
  noSpace: NoSpaceError,
  unsupported: UnsupportedError,
  headMoved: HeadMovedError,
  rejected: RejectedError,
  notRepository: NotRepositoryError,
  tooLarge: TooLargeError,
  unknownRevision: UnknownRevisionError,
});

// The status an unstreamed answer gives each kind of a command that did not
// complete: the status of an error that arrived as the last line of a
// streamed answer (under its 200) or as a session's "error" message.
const commandStatus: Readonly<Record<string, number>> = {
  prepare: 400,
  start: 422,
  timeout: 504,
  abort: 499,
  overflow: 413,
  transport: 502,
  cleanup: 500,
};

/** The status of `kind` where the answer's own status does not say it (`fallback` for other kinds). */
export function statusOfKind(kind: string, fallback: number): number {
  return commandStatus[kind] ?? fallback;
}

/** Builds the error for an API answer of `status` and `kind`. */
export function errorFor(kind: string, message: string, init: CorralErrorInit = {}): CorralError {
  // Every 429 is a rate limit, whatever its kind (commands say "prepare").
  const cls = init.status === 429 ? RateLimitedError : (ERROR_KINDS[kind] ?? CorralError);
  return new cls(kind, message, init);
}
