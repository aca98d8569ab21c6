"""The asynchronous client: the one implementation of the API. The
synchronous one (_sync) runs these coroutines on an event loop of its own.

Every call is bounded by the client's deadline (``AsyncCorral(deadline=)``,
30 s by default): a request's whole answer, a WebSocket's handshake. Longer
calls say how they are bounded: a command by its timeout plus the deadline,
a transfer by the deadline between two reads or writes, an open WebSocket
(a session, a terminal, a watch, a followed process output) by pings, so
that a daemon that stopped answering fails it with Transport within the
deadline.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import os
from dataclasses import dataclass
from typing import (Any, AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Mapping,
                    Optional, Sequence, Tuple, Generic, TypeVar, Union)

import httpx
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.legacy.client import WebSocketClientProtocol

from ._conn import DEFAULT_DEADLINE, LINK_ERRORS, Connection, Deadline, keepalive, link_error, query, ws_closed_error
from ._errors import CorralError, Invalid, Transport, from_body
from ._types import (Chunk, CommandResult, EgressPolicy, ExitStatus, FileEvent, FileInfo, FileList, Limits, Machine,
                     Member, OutputEnd, ProcessInfo, ProjectInfo)
from ._utf8 import Splitter

_T = TypeVar("_T")
_C = TypeVar("_C")

#: The timeout of a command run without one (the daemon's default).
DEFAULT_COMMAND_TIMEOUT = 10.0

OnOutput = Callable[[Chunk], Union[None, Awaitable[None]]]
Data = Union[bytes, str, Iterable[bytes], AsyncIterable[bytes], Any]


@dataclass(frozen=True)
class OutputLimit:
    """Bytes of output a command may write before it fails with Overflow:
    per stream (``stdout``, ``stderr``) or both together (``combined``).
    ``None`` or 0 means the daemon's default (1 MiB per stream)."""

    stdout: Optional[int] = None
    stderr: Optional[int] = None
    combined: Optional[int] = None

    def to_json(self) -> Dict[str, int]:
        d = {"stdout": self.stdout, "stderr": self.stderr, "combined": self.combined}
        return {k: v for k, v in d.items() if v}


class _Closing:
    """``async with`` closes it (``aclose``)."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: _C) -> _C:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class _Generated(_Closing, Generic[_T]):
    """An asynchronous iterator over what its generator ``_items`` yields."""

    def __init__(self) -> None:
        self._gen = self._items()

    def _items(self) -> AsyncGenerator[_T, None]:
        raise NotImplementedError

    def __aiter__(self: _C) -> _C:
        return self

    async def __anext__(self) -> _T:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Stops it early; what it was reading is released."""
        await self._gen.aclose()


class AsyncCorral(_Closing):
    """A client of one corral daemon.

    ``url`` is ``http(s)://host:port`` or ``unix:///path/to/corral.sock``
    and ``token`` a bearer token; either left out is read from
    ``CORRAL_URL``/``CORRAL_TOKEN``. ``deadline`` is the seconds any call
    waits for the daemon (see the module's documentation). Close it
    (``await client.aclose()`` or ``async with``).
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 deadline: float = DEFAULT_DEADLINE) -> None:
        self._conn = Connection(url if url else os.environ.get("CORRAL_URL", ""),
                                token if token else os.environ.get("CORRAL_TOKEN", ""), deadline)
        self.projects = AsyncProjects(self._conn)

    async def aclose(self) -> None:
        """Closes its connections. Idempotent."""
        await self._conn.aclose()

    def project(self, project_id: int) -> "AsyncProject":
        """The project ``project_id``, without asking the daemon."""
        return AsyncProject(self._conn, project_id)

    async def whoami(self) -> Dict[str, Any]:
        """The caller's account: ``{"id", "name", "admin"...}``."""
        return await self._conn.json("GET", "/v1/whoami")

    async def health(self) -> Dict[str, Any]:
        """The daemon's health (store, sandbox, worker); Unavailable when unhealthy."""
        return await self._conn.json("GET", "/healthz")

    async def metrics(self) -> str:
        """The daemon's Prometheus metrics (an administrator's token over TCP)."""
        return (await self._conn.request("GET", "/metrics")).text

    async def openapi(self) -> Dict[str, Any]:
        """The daemon's OpenAPI document."""
        return await self._conn.json("GET", "/openapi.json")

    async def create_account(self, name: str) -> Dict[str, Any]:
        """Creates an account (daemon admins only)."""
        return await self._conn.json("POST", "/v1/accounts", json_body={"name": name})

    async def create_token(self, account: str, name: str = "") -> Dict[str, Any]:
        """Mints a token for ``account`` (one's own, or any for an admin):
        ``{"id", "accountId", "name", "token"}``; the token is shown once."""
        body = {"name": name} if name else {}
        return await self._conn.json("POST", f"/v1/accounts/{_seg(account)}/tokens", json_body=body)

    async def images(self) -> List[Dict[str, Any]]:
        """The machines' images in the daemon's store (daemon admins only):
        ``[{"name", "id", "digest", "source", "created", "size", "layers", "config"}]``."""
        return await self._conn.json("GET", "/v1/images")

    async def pull_image(self, ref: str, name: Optional[str] = None) -> Dict[str, Any]:
        """Pulls ``ref`` from its registry into the daemon's image store under
        ``name`` (default: the last part of the repository), replacing an image
        of that name (daemon admins only); projects then use it by name
        (``Project.set_machine(image=...)``). A registry that cannot be reached
        or has no such image raises BadGateway."""
        body: Dict[str, Any] = {"ref": ref}
        if name:
            body["name"] = name
        return await self._conn.json("POST", "/v1/images", json_body=body)


class AsyncProjects:
    """The caller's projects."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def create(self, name: str, *, kind: str = "managed", root: Optional[str] = None,
                     from_: Optional[str] = None, git: Optional[str] = None,
                     export_remotes: Optional[Sequence[str]] = None) -> "AsyncProject":
        """Creates a project the caller owns: managed (a machine) by default,
        its workspace empty, copied ``from_`` a host directory or cloned from
        ``git``; ``kind="host"`` with a host ``root`` needs the daemon's and
        an admin's permission. ``export_remotes`` narrows the remotes the
        daemon lets it export to."""
        body: Dict[str, Any] = {"name": name, "kind": kind, "root": root, "from": from_, "git": git,
                                "exportRemotes": list(export_remotes) if export_remotes is not None else None}
        info = ProjectInfo.from_json(await self._conn.json(
            "POST", "/v1/projects", json_body={k: v for k, v in body.items() if v is not None}))
        return AsyncProject(self._conn, info.id, info)

    async def list(self) -> List[ProjectInfo]:
        """The projects the caller is a member of."""
        return [ProjectInfo.from_json(p) for p in await self._conn.json("GET", "/v1/projects")]

    async def get(self, project_id: int) -> "AsyncProject":
        """The project, with its ``info``; Forbidden if it is not the caller's."""
        p = AsyncProject(self._conn, project_id)
        await p.refresh()
        return p


class AsyncProject:
    """A project: its commands, sessions, background processes and files.

    ``info`` is what the daemon last said about it (``refresh`` asks again;
    ``None`` until then for a project made with ``AsyncCorral.project``).
    """

    def __init__(self, conn: Connection, project_id: int, info: Optional[ProjectInfo] = None) -> None:
        self._conn = conn
        self.id = project_id
        self.info = info
        self._path = f"/v1/projects/{int(project_id)}"
        self.processes = AsyncProcesses(conn, self._path)
        self.files = AsyncFiles(conn, self._path)

    def __repr__(self) -> str:
        return f"<Project {self.id}{' ' + self.info.name if self.info else ''}>"

    async def refresh(self) -> ProjectInfo:
        self.info = ProjectInfo.from_json(await self._conn.json("GET", self._path))
        return self.info

    async def delete(self) -> None:
        """Deletes the project and its workspace (Conflict while it has live leases)."""
        await self._conn.request("DELETE", self._path)

    async def reset(self) -> None:
        """Stops the machine and discards what guest root changed (owners)."""
        await self._conn.request("POST", self._path + "/reset")

    async def set_machine(self, *, image: Optional[str] = None, limits: Optional[Limits] = None) -> Machine:
        """Sets the machine's image and limits (owners; from its next request)."""
        body: Dict[str, Any] = {}
        if image is not None:
            body["image"] = image
        if limits is not None:
            body["limits"] = limits.to_json()
        return Machine.from_json(await self._conn.json("PUT", self._path + "/machine", json_body=body))

    async def egress(self) -> EgressPolicy:
        return EgressPolicy.from_json(await self._conn.json("GET", self._path + "/egress"))

    async def set_egress(self, policy: EgressPolicy) -> EgressPolicy:
        """Sets the machine's network policy (owners; applies within a second)."""
        return EgressPolicy.from_json(await self._conn.json("PUT", self._path + "/egress", json_body=policy.to_json()))

    async def egress_log(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The newest connection attempts of the machine, newest first."""
        return await self._conn.json("GET", self._path + "/egress/log", params=query(("limit", limit)))

    async def members(self) -> List[Member]:
        return [Member.from_json(m) for m in await self._conn.json("GET", self._path + "/members")]

    async def add_member(self, account: str, *, role: str = "member", trusted: bool = False) -> Member:
        body: Dict[str, Any] = {"account": account, "role": role}
        if trusted:
            body["trusted"] = True
        return Member.from_json(await self._conn.json("POST", self._path + "/members", json_body=body))

    async def run(self, argv: Sequence[str], *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                  user: Optional[str] = None, stdin: Union[bytes, str, None] = None, timeout: Optional[float] = None,
                  limits: Optional[OutputLimit] = None, lease_kind: Optional[str] = None,
                  on_stdout: Optional[OnOutput] = None, on_stderr: Optional[OnOutput] = None,
                  deadline: Optional[float] = None) -> CommandResult:
        """Runs ``argv`` to completion and returns its result; a nonzero
        exit or a signal is a result, never an exception.

        ``timeout`` (seconds; default 10) kills it when it runs longer:
        Timeout, with the output it wrote. ``on_stdout``/``on_stderr``
        receive its output as it arrives (functions or coroutine functions,
        called with a Chunk). A command that did not complete raises the
        exception of its kind (Timeout, Overflow, Start, Transport…), its
        partial output in ``stdout``/``stderr``. The client waits ``timeout``
        plus its deadline at most (``deadline`` overrides that sum).
        """
        stream = self.stream(argv, cwd=cwd, env=env, user=user, stdin=stdin, timeout=timeout, limits=limits,
                             lease_kind=lease_kind, deadline=deadline)
        try:
            async for chunk in stream:
                cb = on_stdout if chunk.stream == "stdout" else on_stderr
                if cb is not None:
                    r = cb(chunk)
                    if inspect.isawaitable(r):
                        await r
        finally:
            await stream.aclose()
        assert stream.result is not None
        return stream.result

    def stream(self, argv: Sequence[str], *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
               user: Optional[str] = None, stdin: Union[bytes, str, None] = None, timeout: Optional[float] = None,
               limits: Optional[OutputLimit] = None, lease_kind: Optional[str] = None,
               deadline: Optional[float] = None) -> "AsyncCommandStream":
        """Runs ``argv`` as ``run`` does, yielding its output as it arrives:
        ``async for chunk in project.stream([...])``; then ``result`` is the
        result, or the iteration raises the error. Closing it early
        (``aclose``) cancels the command."""
        if isinstance(argv, str) or not argv:
            raise Invalid("argv must be a non-empty list of strings")
        body: Dict[str, Any] = {"command": {"type": "argv", "file": argv[0], "args": list(argv[1:])},
                                "encoding": "base64"}
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if user is not None:
            body["user"] = user
        if stdin:
            body["stdin"] = base64.b64encode(stdin.encode() if isinstance(stdin, str) else stdin).decode()
        if timeout is not None:
            body["timeoutMs"] = max(int(timeout * 1000), 1)
        if limits is not None and limits.to_json():
            body["outputLimit"] = limits.to_json()
        if lease_kind is not None:
            body["leaseKind"] = lease_kind
        if deadline is None:
            deadline = (timeout or DEFAULT_COMMAND_TIMEOUT) + self._conn.deadline
        return AsyncCommandStream(self._conn, self._path + "/commands", body, deadline)

    async def session(self, argv: Sequence[str], *, cwd: Optional[str] = None,
                      env: Optional[Mapping[str, str]] = None, user: Optional[str] = None,
                      lease_kind: Optional[str] = None, tty: Optional[Tuple[int, int]] = None) -> "AsyncSession":
        """Starts ``argv`` as an interactive session (stdin, output as it is
        written, no timeout): it runs until it exits or the session is
        closed. ``tty=(rows, cols)`` runs it on a terminal (see terminal).
        It returns once the command started (or failed to: ``wait`` raises
        why), within the deadline."""
        if isinstance(argv, str) or not argv:
            raise Invalid("argv must be a non-empty list of strings")
        params = [("argv", a) for a in argv] + query(("cwd", cwd), ("leaseKind", lease_kind), ("user", user))
        params += [("env", f"{k}={v}") for k, v in (env or {}).items()]
        if tty is not None:
            params += query(("tty", True), ("rows", tty[0]), ("cols", tty[1]))
        # The daemon reads the socket (and answers pings) once the command
        # started: until its "started" the deadline bounds the wait, then
        # pings do.
        ws = await self._conn.websocket(self._path + "/sessions", params, keepalive=False)
        s = AsyncSession(ws, tty is not None)
        try:
            await Deadline(self._conn.deadline).within(s._started.wait())
        except BaseException:
            await s.aclose()
            raise
        s._keepalive = asyncio.ensure_future(keepalive(ws, self._conn.deadline))
        return s

    async def terminal(self, argv: Sequence[str] = ("sh",), *, rows: int = 24, cols: int = 80,
                       cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                       user: Optional[str] = None) -> "AsyncSession":
        """Opens a pseudo-terminal running ``argv`` (a shell by default):
        ``write`` keystrokes, read its output, ``resize`` it."""
        return await self.session(argv, cwd=cwd, env=env, user=user, tty=(rows, cols))

    async def lsp(self, server: str) -> "AsyncMessages":
        """A language server (``gopls`` unless the daemon configures others)
        in the machine: send and receive its JSON-RPC messages as dicts."""
        return AsyncMessages(await self._conn.websocket(f"{self._path}/lsp/{_seg(server)}"))

    async def sites(self) -> List[Dict[str, Any]]:
        """The project's published sites."""
        return await self._conn.json("GET", self._path + "/sites")

    async def publish_site(self, name: str, port: int) -> Dict[str, Any]:
        """Publishes the machine's 127.0.0.1:``port`` as site ``name``."""
        return await self._conn.json("PUT", f"{self._path}/sites/{_seg(name)}", json_body={"port": port})

    async def unpublish_site(self, name: str) -> None:
        await self._conn.request("DELETE", f"{self._path}/sites/{_seg(name)}")

    async def site_url(self, name: str, *, path: Optional[str] = None,
                       expires_in: Optional[int] = None) -> Dict[str, Any]:
        """A signed URL a browser opens the site with: ``{"url", "expires"}``."""
        body: Dict[str, Any] = {}
        if path is not None:
            body["path"] = path
        if expires_in is not None:
            body["expiresInSeconds"] = expires_in
        return await self._conn.json("POST", f"{self._path}/sites/{_seg(name)}/url", json_body=body)

    async def export(self, remote: str, branch: str, expected_head: str) -> Dict[str, Any]:
        """Pushes ``branch`` (at ``expected_head``, else HeadMoved) to a remote the operator allows."""
        return await self._conn.json("POST", self._path + "/export",
                                     json_body={"remote": remote, "branch": branch, "expectedHead": expected_head})

    async def git_status(self) -> Dict[str, Any]:
        return await self._conn.json("GET", self._path + "/git/status")

    async def git_log(self, *, ref: Optional[str] = None, skip: Optional[int] = None, limit: Optional[int] = None,
                      path: Optional[str] = None) -> Dict[str, Any]:
        return await self._conn.json("GET", self._path + "/git/log",
                                     params=query(("ref", ref), ("skip", skip), ("limit", limit), ("path", path)))

    async def git_diff(self, *, from_: Optional[str] = None, to: Optional[str] = None, staged: bool = False,
                       path: Optional[str] = None, max: Optional[int] = None) -> Dict[str, Any]:
        return await self._conn.json("GET", self._path + "/git/diff", params=query(
            ("from", from_), ("to", to), ("staged", staged or None), ("path", path), ("max", max)))

    async def git_show(self, *, ref: Optional[str] = None, path: Optional[str] = None,
                       max: Optional[int] = None) -> Dict[str, Any]:
        return await self._conn.json("GET", self._path + "/git/show",
                                     params=query(("ref", ref), ("path", path), ("max", max)))


def _seg(s: str) -> str:
    from urllib.parse import quote
    return quote(s, safe="")


class AsyncCommandStream(_Generated[Chunk]):
    """A running command's output, chunk by chunk (see AsyncProject.stream).

    Chunks never end inside a UTF-8 character. After the last chunk,
    ``result`` holds the CommandResult, or the iteration raised the
    command's error (with all its partial output).
    """

    def __init__(self, conn: Connection, path: str, body: Dict[str, Any], deadline: float) -> None:
        self._conn, self._path, self._body, self._deadline = conn, path, body, deadline
        self.result: Optional[CommandResult] = None
        super().__init__()

    async def aclose(self) -> None:
        """Stops reading; a command still running is cancelled by the daemon."""
        await super().aclose()

    async def _items(self) -> AsyncGenerator[Chunk, None]:
        dl = Deadline(self._deadline)
        resp = await self._conn.open_stream("POST", self._path, deadline=dl, json_body=self._body,
                                            headers={"Accept": "application/x-ndjson"}, base64_output=True)
        split = {"stdout": Splitter(), "stderr": Splitter()}
        try:
            async for line in self._conn.lines(resp, dl):
                name = next(iter(line)) if len(line) == 1 else ""
                if name in split:
                    data = split[name].feed(base64.b64decode(line[name]))
                    if data:
                        yield Chunk(name, data)
                    continue
                for name, s in split.items():
                    rest = s.flush()
                    if rest:
                        yield Chunk(name, rest)
                if "error" in line:
                    raise from_body(line, status=None, base64_output=True)
                if "code" in line or "signal" in line:
                    self.result = CommandResult(
                        code=line.get("code"), signal=line.get("signal"), oom_killed=bool(line.get("oomKilled")),
                        stdout_bytes=base64.b64decode(line.get("stdout") or ""),
                        stderr_bytes=base64.b64decode(line.get("stderr") or ""))
                    return
                raise Transport(f"unexpected line from the daemon: {str(line)[:200]}")
            raise Transport("the daemon's answer ended before the command's result")
        finally:
            await resp.aclose()


_EOF = object()


class AsyncSession(_Closing):
    """An interactive session (a command with stdin) or a terminal.

    Iterate it for its output (Chunks; a terminal's all come as stdout),
    ``write`` its input, ``wait`` for its ExitStatus. A session that ended
    with an error (it could not start, its authorization was revoked, the
    link was lost) raises it from ``wait``. ``aclose`` ends it (the daemon
    cancels the command).
    """

    def __init__(self, ws: WebSocketClientProtocol, tty: bool) -> None:
        self._ws = ws
        self.tty = tty
        self.lease_id: Optional[str] = None
        self.exit: Optional[ExitStatus] = None
        self._error: Optional[CorralError] = None
        # Bounded: output is read from the socket only as fast as it is
        # consumed, as the daemon reads the command's.
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue(256)
        self._ended = False
        self._unread: Optional[Chunk] = None  # what expect read past its pattern
        self._started = asyncio.Event()  # started, or ended before
        self._keepalive: "Optional[asyncio.Future[None]]" = None
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        split = {1: Splitter(), 2: Splitter()}
        names = {1: "stdout", 2: "stderr"}
        try:
            async for msg in self._ws:
                if isinstance(msg, bytes):
                    if msg and msg[0] in split:
                        data = split[msg[0]].feed(msg[1:])
                        if data:
                            await self._queue.put(Chunk(names[msg[0]], data))
                    continue
                m = json.loads(msg)
                if m.get("type") == "started":
                    self.lease_id = m.get("leaseId")
                    self._started.set()
                elif m.get("type") == "exit":
                    self.exit = ExitStatus.from_json(m)
                elif m.get("type") == "error":
                    self._error = from_body({"error": m}, status=None)
        except ConnectionClosed as e:
            if self.exit is None and self._error is None:
                self._error = ws_closed_error(e)
        except LINK_ERRORS as e:
            self._error = link_error(e)
        finally:
            self._started.set()
            if self._keepalive is not None:
                self._keepalive.cancel()
            for k, s in split.items():
                rest = s.flush()
                if rest:
                    await self._queue.put(Chunk(names[k], rest))
            if self.exit is None and self._error is None:
                self._error = Transport("the session ended without an exit status")
            await self._queue.put(_EOF)

    def __aiter__(self) -> "AsyncSession":
        return self

    async def __anext__(self) -> Chunk:
        c = await self.read()
        if c is None:
            raise StopAsyncIteration
        return c

    async def read(self, timeout: Optional[float] = None) -> Optional[Chunk]:
        """The next chunk of output, or None once the session ended; with
        ``timeout``, asyncio.TimeoutError if none came in that many seconds."""
        if self._unread is not None:
            item, self._unread = self._unread, None
            return item
        if self._ended:
            return None
        item = await (asyncio.wait_for(self._queue.get(), timeout) if timeout is not None else self._queue.get())
        if item is _EOF:
            self._ended = True
            return None
        return item

    async def expect(self, pattern: Union[bytes, str], timeout: float = 10.0) -> bytes:
        """Reads output (of both streams) until it contains ``pattern`` and
        returns it, up to the end of the pattern's first occurrence; what
        came after it is read next. Raises asyncio.TimeoutError after
        ``timeout`` seconds, EOFError if the session ended first."""
        want = pattern.encode() if isinstance(pattern, str) else pattern
        seen = b""
        stream = "stdout"
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while want not in seen:
            c = await self.read(max(end - loop.time(), 0.0))
            if c is None:
                raise EOFError(f"the session ended before {pattern!r}; output: {seen[-500:]!r}")
            seen += c.data
            stream = c.stream
        cut = seen.index(want) + len(want)
        if cut < len(seen):
            self._unread = Chunk(stream, seen[cut:])
        return seen[:cut]

    async def write(self, data: Union[bytes, str]) -> None:
        """Sends ``data`` to its stdin (keystrokes on a terminal)."""
        await self._send(b"\x00" + (data.encode() if isinstance(data, str) else data))

    async def close_stdin(self) -> None:
        """Ends its stdin (the command reads EOF; nothing on a terminal)."""
        await self._send(json.dumps({"type": "eof"}))

    async def resize(self, rows: int, cols: int) -> None:
        """Resizes the terminal (its foreground job gets SIGWINCH)."""
        await self._send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    async def _send(self, msg: Union[bytes, str]) -> None:
        try:
            await self._ws.send(msg)
        except ConnectionClosed as e:
            raise self._error or ws_closed_error(e) from e
        except LINK_ERRORS as e:
            raise link_error(e) from e

    async def wait(self) -> ExitStatus:
        """Waits for it to end (output not read yet is dropped) and returns
        its ExitStatus, or raises the error it ended with."""
        while await self.read() is not None:
            pass
        await self._reader
        if self._error is not None:
            raise self._error
        assert self.exit is not None
        return self.exit

    async def aclose(self) -> None:
        """Closes the session; a command still running is cancelled. Idempotent."""
        await self._ws.close()
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._reader.cancel()
        try:
            await self._reader
        except BaseException:
            pass



class AsyncMessages(_Closing):
    """A WebSocket of JSON messages (a language server's JSON-RPC)."""

    def __init__(self, ws: WebSocketClientProtocol) -> None:
        self._ws = ws

    async def send(self, message: Dict[str, Any]) -> None:
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed as e:
            raise ws_closed_error(e) from e
        except LINK_ERRORS as e:
            raise link_error(e) from e

    async def receive(self) -> Dict[str, Any]:
        """The next message; EOFError once the socket closed normally."""
        try:
            msg = await self._ws.recv()
        except ConnectionClosedOK:
            raise EOFError("the daemon closed the socket") from None
        except ConnectionClosed as e:
            raise ws_closed_error(e) from e
        return json.loads(msg)

    async def aclose(self) -> None:
        await self._ws.close()



class AsyncProcesses:
    """A project's background processes."""

    def __init__(self, conn: Connection, project_path: str) -> None:
        self._conn = conn
        self._path = project_path + "/processes"

    async def start(self, argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None, user: Optional[str] = None, tty: Optional[Tuple[int, int]] = None,
                    lifetime: Optional[float] = None, output_buffer: Optional[int] = None) -> "AsyncProcess":
        """Starts ``argv`` detached: it runs until it exits, its ``lifetime``
        (seconds; default 1 h, at most 24 h) ends or it is killed, whoever
        is connected. The daemon keeps its newest ``output_buffer`` bytes of
        output (default 1 MiB)."""
        if isinstance(argv, str) or not argv:
            raise Invalid("argv must be a non-empty list of strings")
        body: Dict[str, Any] = {"argv": list(argv)}
        if env:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if user is not None:
            body["user"] = user
        if tty is not None:
            body["tty"] = {"rows": tty[0], "cols": tty[1]}
        if lifetime is not None:
            body["lifetime"] = max(int(lifetime), 1)
        if output_buffer is not None:
            body["outputBuffer"] = output_buffer
        info = ProcessInfo.from_json(await self._conn.json("POST", self._path, json_body=body))
        return AsyncProcess(self._conn, self._path, info)

    async def list(self) -> List[ProcessInfo]:
        """The running ones and the ended ones still kept, oldest first."""
        return [ProcessInfo.from_json(p) for p in (await self._conn.json("GET", self._path))["processes"]]

    async def get(self, process_id: str) -> "AsyncProcess":
        """The process (NotFound once forgotten)."""
        info = ProcessInfo.from_json(await self._conn.json("GET", f"{self._path}/{_seg(process_id)}"))
        return AsyncProcess(self._conn, self._path, info)


class AsyncProcess:
    """A background process: ``id`` and ``info`` (as last seen)."""

    def __init__(self, conn: Connection, processes_path: str, info: ProcessInfo) -> None:
        self._conn = conn
        self.id = info.id
        self.info = info
        self._path = f"{processes_path}/{_seg(info.id)}"

    def __repr__(self) -> str:
        return f"<Process {self.id} {self.info.state}>"

    async def refresh(self) -> ProcessInfo:
        self.info = ProcessInfo.from_json(await self._conn.json("GET", self._path))
        return self.info

    def output(self, since: int = 0, *, follow: bool = True) -> "AsyncOutput":
        """Its output from offset ``since`` on (offsets count the bytes of
        both streams together; an offset that fell off the daemon's ring
        starts where the ring starts): ``async for chunk in ...``, each
        chunk with its ``offset``. With ``follow`` it goes on until the
        process ended and everything was sent, else it ends with what is
        there. Then ``end`` says where to continue and the state, and
        ``skipped`` how many bytes the daemon no longer had. Each chunk ends
        on a UTF-8 character boundary (the daemon keeps output so)."""
        return AsyncOutput(self._conn, self._path + "/output", since, follow)

    async def wait(self) -> ProcessInfo:
        """Follows its output to the end (dropping it) and returns its final info."""
        out = self.output(self.info.output_end, follow=True)
        async for _ in out:
            pass
        return await self.refresh()

    async def signal(self, signal: str) -> ProcessInfo:
        """Sends ``signal`` (``"TERM"``, ``"SIGINT"``…) to every process of
        its tree; Conflict once it ended."""
        self.info = ProcessInfo.from_json(await self._conn.json("POST", self._path + "/signal",
                                                                json_body={"signal": signal}))
        return self.info

    async def kill(self) -> ProcessInfo:
        """Kills its whole tree, waits for it to end, makes the daemon forget
        it, and returns its last state."""
        self.info = ProcessInfo.from_json(await self._conn.json("DELETE", self._path))
        return self.info


class AsyncOutput(_Generated[Chunk]):
    """A background process's output (see AsyncProcess.output)."""

    def __init__(self, conn: Connection, path: str, since: int, follow: bool) -> None:
        self._conn, self._path, self._since, self._follow = conn, path, since, follow
        self.end: Optional[OutputEnd] = None
        #: Bytes of output between ``since`` and the end that the daemon no
        #: longer had (they fell off its ring): never lost silently.
        self.skipped = 0
        super().__init__()

    async def _lines(self) -> AsyncGenerator[Dict[str, Any], None]:
        params = query(("from", self._since), ("follow", self._follow), ("encoding", "base64"))
        if self._follow:
            # A WebSocket: its pings notice a daemon gone quiet.
            ws = await self._conn.websocket(self._path, params)
            try:
                async for msg in ws:
                    yield json.loads(msg)
            except ConnectionClosed as e:
                raise ws_closed_error(e) from e
            except LINK_ERRORS as e:
                raise link_error(e) from e
            finally:
                await ws.close()
            return
        dl = Deadline(self._conn.deadline)
        resp = await self._conn.open_stream("GET", self._path, deadline=dl, params=params)
        try:
            async for line in self._conn.lines(resp, dl):
                yield line
        finally:
            await resp.aclose()

    async def _items(self) -> AsyncGenerator[Chunk, None]:
        lines = self._lines()
        expected = self._since
        try:
            async for line in lines:
                if "stream" in line:
                    chunk = Chunk(line["stream"], base64.b64decode(line.get("data") or ""), line.get("offset"))
                    if chunk.offset is not None:
                        self.skipped += max(chunk.offset - expected, 0)
                        expected = chunk.offset + len(chunk.data)
                    yield chunk
                elif "state" in line:
                    self.end = OutputEnd.from_json(line)
                    self.skipped += max(self.end.offset - expected, 0)
                    return
            raise Transport("the process's output ended without its last line")
        finally:
            await lines.aclose()


class AsyncFiles:
    """A project's files. Paths are guest paths (``/workspace/x``,
    ``/home/user/y``) or relative to the workspace; ``user`` (a managed
    machine's user) is whom the call acts as (default the image's user)."""

    def __init__(self, conn: Connection, project_path: str) -> None:
        self._conn = conn
        self._path = project_path + "/files"

    async def read(self, path: str, *, user: Optional[str] = None) -> bytes:
        """The whole file."""
        out = bytearray()
        async with self.read_stream(path, user=user) as s:
            async for b in s:
                out += b
        return bytes(out)

    def read_stream(self, path: str, *, user: Optional[str] = None) -> "AsyncFileReader":
        """The file as a stream of byte chunks: ``async with files.read_stream(p) as r: async for b in r``."""
        return AsyncFileReader(self._conn, self._path, query(("path", path), ("user", user)))

    async def write(self, path: str, data: Data, *, mode: Optional[int] = None, parents: bool = False,
                    user: Optional[str] = None) -> FileInfo:
        """Replaces the file with ``data`` (bytes, str, an iterable or async
        iterable of bytes, or a binary file object) atomically: readers see
        the old or the whole new file. ``mode`` defaults to 0644 for a new
        file. With ``parents`` missing directories are made (as ``user``),
        else a missing one is NotFound. Each read or write of the transfer
        has the deadline; the transfer as a whole none."""
        params = query(("path", path), ("mode", None if mode is None else format(mode, "04o")),
                       ("mkdirs", parents or None), ("user", user))
        resp = await self._conn.upload("PUT", self._path, params, data)
        return FileInfo.from_json(resp.json())

    async def stat(self, path: str, *, user: Optional[str] = None) -> FileInfo:
        return FileInfo.from_json(await self._conn.json("GET", self._path + "/stat",
                                                        params=query(("path", path), ("user", user))))

    async def list(self, path: str = "", *, depth: Optional[int] = None, limit: Optional[int] = None,
                   user: Optional[str] = None) -> FileList:
        """The directory's entries, name order, ``depth`` levels deep (default 1)."""
        d = await self._conn.json("GET", self._path + "/list", params=query(
            ("path", path or None), ("depth", depth), ("limit", limit), ("user", user)))
        return FileList(dir=FileInfo.from_json(d["dir"]), entries=[FileInfo.from_json(e) for e in d["entries"] or []],
                        truncated=bool(d.get("truncated")))

    async def mkdir(self, path: str, *, mode: Optional[int] = None, parents: bool = False,
                    user: Optional[str] = None) -> FileInfo:
        body: Dict[str, Any] = {"path": path}
        if mode is not None:
            body["mode"] = format(mode, "04o")
        if parents:
            body["parents"] = True
        if user is not None:
            body["user"] = user
        return FileInfo.from_json(await self._conn.json("POST", self._path + "/mkdir", json_body=body))

    async def remove(self, path: str, *, recursive: bool = False, user: Optional[str] = None) -> None:
        body: Dict[str, Any] = {"path": path}
        if recursive:
            body["recursive"] = True
        if user is not None:
            body["user"] = user
        await self._conn.request("POST", self._path + "/remove", json_body=body)

    async def rename(self, src: str, dst: str, *, user: Optional[str] = None) -> None:
        body: Dict[str, Any] = {"from": src, "to": dst}
        if user is not None:
            body["user"] = user
        await self._conn.request("POST", self._path + "/rename", json_body=body)

    async def watch(self, path: str = "", *, recursive: bool = False, user: Optional[str] = None) -> "AsyncWatch":
        """Watches ``path`` (the workspace by default): once this returns,
        every change is reported, in the kernel's order, as FileEvents."""
        ws = await self._conn.websocket(self._path + "/watch", query(
            ("path", path or None), ("recursive", recursive or None), ("user", user)))
        return AsyncWatch(ws)


class AsyncFileReader(_Closing):
    """A file being read: ``size`` and ``mode`` once open, its bytes by iteration."""

    def __init__(self, conn: Connection, path: str, params: Any) -> None:
        self._conn, self._path, self._params = conn, path, params
        self._resp: Optional[httpx.Response] = None
        self._it: Optional[AsyncIterator[bytes]] = None
        self.size: Optional[int] = None
        self.mode: Optional[int] = None

    async def open(self) -> "AsyncFileReader":
        if self._resp is None:
            self._resp = await self._conn.open_stream("GET", self._path, deadline=Deadline(self._conn.deadline),
                                                      params=self._params)
            h = self._resp.headers
            self.size = int(h["Content-Length"]) if "Content-Length" in h else None
            self.mode = int(h["X-Corral-Mode"], 8) if "X-Corral-Mode" in h else None
            self._it = self._resp.aiter_bytes().__aiter__()
        return self

    def __aiter__(self) -> "AsyncFileReader":
        return self

    async def __anext__(self) -> bytes:
        await self.open()
        assert self._it is not None
        try:
            return await self._it.__anext__()
        except LINK_ERRORS as e:
            raise link_error(e, self._conn.deadline) from e

    async def aclose(self) -> None:
        if self._resp is not None:
            await self._resp.aclose()

    async def __aenter__(self) -> "AsyncFileReader":
        return await self.open()


class AsyncWatch(_Closing):
    """FileEvents as they happen (see AsyncFiles.watch); ``aclose`` ends the watch."""

    def __init__(self, ws: WebSocketClientProtocol) -> None:
        self._ws = ws

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> FileEvent:
        try:
            msg = await self._ws.recv()
        except ConnectionClosedOK:
            raise StopAsyncIteration from None
        except ConnectionClosed as e:
            raise ws_closed_error(e) from e
        except LINK_ERRORS as e:
            raise link_error(e) from e
        return FileEvent.from_json(json.loads(msg))

    async def aclose(self) -> None:
        await self._ws.close()
