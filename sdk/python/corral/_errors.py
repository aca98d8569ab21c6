"""Errors: one exception class per error kind the API answers.

Every error the daemon answers is ``{"error":{"kind","message","stdout",
"stderr"}}`` with an HTTP status; :func:`from_answer` turns it into an
instance of the class :data:`KINDS` maps its kind to (:class:`RateLimited`
for every 429, whatever its kind). A command that started and did not
complete carries its partial output. Failures of the link to the daemon are
:class:`Transport` (no status), and a call that outlived its client-side
deadline is :class:`DeadlineExceeded`, a :class:`Transport`.
"""

from __future__ import annotations

import base64
import json
from typing import Dict, Optional, Type


class CorralError(Exception):
    """An error of the corral API or of the link to it.

    ``kind`` is the API's error kind (``"timeout"``, ``"forbidden"``, …),
    ``status`` the HTTP status (``None`` when the daemon answered nothing,
    or the error arrived as the last line of a streamed answer after its
    200), ``message`` the daemon's sentence. ``stdout_bytes`` and
    ``stderr_bytes`` hold the partial output of a command that started but
    did not complete (empty otherwise); ``stdout`` and ``stderr`` are their
    text (invalid UTF-8 replaced by U+FFFD). ``retry_after`` is the seconds
    a 429 answer asked to wait, else ``None``. ``reason`` says more when the
    daemon knows it (a Start error's ``"notFound"``: no such program, or
    ``"notExecutable"``), else ``None``.
    """

    kind: str = ""

    def __init__(
        self,
        message: str,
        *,
        kind: Optional[str] = None,
        status: Optional[int] = None,
        stdout: bytes = b"",
        stderr: bytes = b"",
        retry_after: Optional[float] = None,
        reason: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        if kind is not None:
            self.kind = kind
        self.message = message
        self.status = status
        self.stdout_bytes = stdout
        self.stderr_bytes = stderr
        self.retry_after = retry_after

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    def __str__(self) -> str:
        where = f"{self.status} " if self.status else ""
        return f"{where}{self.kind}: {self.message}"


# The kinds of a command that did not complete (sandbox.ErrorKind).
class Prepare(CorralError):
    """The command was refused before anything started (400, 403; 429 is RateLimited)."""

    kind = "prepare"


class Start(CorralError):
    """The program could not be started (422)."""

    kind = "start"


class Timeout(CorralError):
    """The command outlived its timeout and was killed (504); partial output."""

    kind = "timeout"


class Abort(CorralError):
    """The command or process was cancelled or killed."""

    kind = "abort"


class Overflow(CorralError):
    """The output went over its limit (413); partial output up to the limit."""

    kind = "overflow"


class Transport(CorralError):
    """The link to the command or to the daemon was lost.

    With ``status`` 502 the daemon lost its link to the command; with
    ``status`` ``None`` this client lost (or never had) its link to the
    daemon: what became of the call is unknown.
    """

    kind = "transport"


class DeadlineExceeded(Transport):
    """The daemon did not answer within the call's client-side deadline."""


class Cleanup(CorralError):
    """Cancelling or releasing the command's resources failed (500)."""

    kind = "cleanup"


# The other kinds of the API.
class Unauthorized(CorralError):
    """No bearer token, or an unknown or revoked one (401)."""

    kind = "unauthorized"


class Forbidden(CorralError):
    """Not allowed, or a project that is not the caller's (403)."""

    kind = "forbidden"


class NotFound(CorralError):
    """No such project (for admins), process, file, site… (404)."""

    kind = "notFound"


class Invalid(CorralError):
    """A malformed request (400, 415)."""

    kind = "invalid"


class RequestTooLarge(CorralError):
    """The request body (or stdin) is over the daemon's cap (413)."""

    kind = "requestTooLarge"


class Conflict(CorralError):
    """Exists already, or in use (409)."""

    kind = "conflict"


class RateLimited(CorralError):
    """An admission budget is exhausted (429): retry after ``retry_after`` seconds.

    Its ``kind`` is the daemon's: ``"busy"``, or ``"prepare"`` for commands.
    """

    kind = "busy"


class Unavailable(CorralError):
    """A domain, the worker or the privileged transport is missing (503)."""

    kind = "unavailable"


class BadGateway(CorralError):
    """A site or a remote could not be reached (502)."""

    kind = "badGateway"


class Internal(CorralError):
    """The daemon failed (500)."""

    kind = "internal"


class NoSpace(CorralError):
    """The project's disk is full (507); nothing was left behind."""

    kind = "noSpace"


class Unsupported(CorralError):
    """The worker lacks the feature (501)."""

    kind = "unsupported"


class HeadMoved(Conflict):
    """Export: the branch is not at the expected head (409)."""

    kind = "headMoved"


class Rejected(Conflict):
    """Export: the remote refused the push (409)."""

    kind = "rejected"


class NotRepository(Conflict):
    """Export: the workspace is not a Git repository (409)."""

    kind = "notRepository"


class TooLarge(CorralError):
    """Export: the bundle is over the cap (413)."""

    kind = "tooLarge"


class UnknownRevision(CorralError):
    """Git reads: no such revision."""

    kind = "unknownRevision"


#: The exception class of each error kind the API answers. A test checks it
#: against every kind docs/openapi.json names.
KINDS: Dict[str, Type[CorralError]] = {
    c.kind: c
    for c in (
        Prepare, Start, Timeout, Abort, Overflow, Transport, Cleanup,
        Unauthorized, Forbidden, NotFound, Invalid, RequestTooLarge, Conflict,
        RateLimited, Unavailable, BadGateway, Internal, NoSpace, Unsupported,
        HeadMoved, Rejected, NotRepository, TooLarge, UnknownRevision,
    )
}

# The kind of an error answer without the pinned body (a proxy's page).
_STATUS_KINDS = {
    400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "notFound",
    409: "conflict", 413: "requestTooLarge", 415: "invalid", 422: "start",
    429: "busy", 500: "internal", 501: "unsupported", 502: "badGateway",
    503: "unavailable", 504: "timeout", 507: "noSpace",
}


def from_body(
    body: object,
    *,
    status: Optional[int],
    base64_output: bool = False,
    retry_after: Optional[float] = None,
) -> CorralError:
    """The exception for a decoded error body ``{"error":{...}}``."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("kind"), str):
        kind = _STATUS_KINDS.get(status or 0, "internal")
        return _make(kind, f"unexpected answer: {str(body)[:200]}", status, b"", b"", retry_after)

    fields: Dict[str, object] = err

    def output(name: str) -> bytes:
        v = fields.get(name) or ""
        if not isinstance(v, str):
            return b""
        if base64_output:
            try:
                return base64.b64decode(v)
            except ValueError:
                return v.encode()
        return v.encode()

    reason = err.get("reason")
    return _make(err["kind"], str(err.get("message", "")), status, output("stdout"), output("stderr"), retry_after,
                 reason if isinstance(reason, str) else None)


def from_answer(
    status: int, body: bytes, headers: "Optional[Dict[str, str]]" = None, *, base64_output: bool = False
) -> CorralError:
    """The exception for an HTTP error answer (status ≥ 400)."""
    retry_after = None
    if headers is not None:
        ra = headers.get("retry-after") or headers.get("Retry-After")
        if ra is not None:
            try:
                retry_after = float(ra)
            except ValueError:
                pass
    try:
        decoded: object = json.loads(body)
    except ValueError:
        decoded = body.decode("utf-8", "replace").strip()
    return from_body(decoded, status=status, base64_output=base64_output, retry_after=retry_after)


def _make(
    kind: str, message: str, status: Optional[int], stdout: bytes, stderr: bytes, retry_after: Optional[float],
    reason: Optional[str] = None,
) -> CorralError:
    cls = KINDS.get(kind, CorralError)
    if status == 429:
        cls = RateLimited
    return cls(message, kind=kind, status=status, stdout=stdout, stderr=stderr, retry_after=retry_after, reason=reason)
