"""The link to the daemon: HTTP requests, streamed answers and WebSockets,
each bounded by a client-side deadline, every failure translated once into
the package's exceptions (see _errors).

URLs: ``http://host:port``, ``https://host:port`` (a path prefix is kept) or
``unix:///path/to/corral.sock``.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import weakref
from typing import Any, AsyncIterable, AsyncIterator, Awaitable, Iterator, Dict, List, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import urlencode, urlsplit

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.legacy.client import WebSocketClientProtocol
from websockets.legacy.client import connect as ws_connect

from ._errors import CorralError, DeadlineExceeded, Invalid, Transport, from_answer

T = TypeVar("T")

#: Seconds a call waits for the daemon when the client is made without
#: ``deadline``.
DEFAULT_DEADLINE = 30.0

# Query parameters: a dict, or a list of pairs (repeated names).
Params = Any

#: The SDK's version: pyproject.toml's and the TypeScript SDK's (a test checks).
VERSION = "0.1.0"


class Deadline:
    """An absolute client-side deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(self.at - time.monotonic(), 0.0)

    async def within(self, aw: Awaitable[T]) -> T:
        """Awaits ``aw``, raising DeadlineExceeded once the deadline passed."""
        try:
            return await asyncio.wait_for(aw, self.remaining())
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"no answer from the daemon within {self.seconds:g} s") from None


def link_error(exc: BaseException, deadline: Optional[float] = None) -> CorralError:
    """The package's exception for a failure of the link to the daemon."""
    if isinstance(exc, CorralError):
        return exc
    if isinstance(exc, (asyncio.TimeoutError, httpx.TimeoutException)):
        within = f" within {deadline:g} s" if deadline is not None else ""
        return DeadlineExceeded(f"no answer from the daemon{within}")
    return Transport(f"the link to the daemon failed: {type(exc).__name__}: {exc}")


# The failures of the link itself (not answers of the daemon).
LINK_ERRORS = (httpx.TransportError, OSError, asyncio.TimeoutError, ConnectionClosed, InvalidHandshake, EOFError)


class _Refused(Exception):
    """A WebSocket handshake answered with an error instead of 101."""

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        super().__init__(status)
        self.status, self.headers, self.body = status, headers, body


class _Protocol(WebSocketClientProtocol):
    """Reads the body of a refused handshake, which carries the error's kind
    (websockets itself drops it)."""

    async def read_http_response(self) -> Any:
        status, headers = await super().read_http_response()
        if status != 101:
            body = b""
            try:
                if "Content-Length" in headers:
                    body = await self.reader.readexactly(min(int(headers["Content-Length"]), 1 << 20))
                elif headers.get("Transfer-Encoding", "").lower() == "chunked":
                    while len(body) < 1 << 20:
                        size = int((await self.reader.readline()).split(b";")[0], 16)
                        if size == 0:
                            break
                        body += await self.reader.readexactly(size)
                        await self.reader.readline()
            except (ValueError, asyncio.IncompleteReadError):
                pass
            raise _Refused(status, {k.lower(): v for k, v in headers.raw_items()}, body)
        return status, headers


class Connection:
    """An authenticated link to one daemon. Use from one event loop."""

    def __init__(self, url: str, token: str, deadline: float) -> None:
        if not url:
            raise Invalid("no daemon URL: pass url= or set CORRAL_URL (http(s)://host:port or unix:///path)")
        if not token:
            raise Invalid("no token: pass token= or set CORRAL_TOKEN")
        if deadline <= 0:
            raise Invalid(f"deadline must be positive, not {deadline}")
        self.deadline = deadline
        parts = urlsplit(url)
        self._unix: Optional[str] = None
        if parts.scheme == "unix":
            if not parts.path:
                raise Invalid(f"bad daemon URL {url!r}: unix:///path/to/corral.sock")
            self._unix = parts.path
            base, self._ws_base = "http://corral", "ws://corral"
        elif parts.scheme in ("http", "https") and parts.netloc:
            base = url.rstrip("/")
            self._ws_base = ("wss" if parts.scheme == "https" else "ws") + base[len(parts.scheme):]
        else:
            raise Invalid(f"bad daemon URL {url!r}: http(s)://host:port or unix:///path/to/corral.sock")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._headers = {"Authorization": f"Bearer {token}", "User-Agent": f"corral-python/{VERSION}"}
        transport = httpx.AsyncHTTPTransport(uds=self._unix) if self._unix else None
        # httpx's timeouts bound each step (connect, each read, each
        # write); whole calls are bounded by a Deadline as well.
        self._uploads: Optional[httpx.Client] = None
        self._sockets: "weakref.WeakSet[WebSocketClientProtocol]" = weakref.WeakSet()
        self.http = httpx.AsyncClient(base_url=base, headers=self._headers, transport=transport,
                                      timeout=httpx.Timeout(deadline), follow_redirects=False)

    async def aclose(self) -> None:
        """Closes every connection: WebSockets still open (sessions,
        watches, followed output) end as if closed one by one."""
        await asyncio.gather(*(ws.close() for ws in list(self._sockets)), return_exceptions=True)
        await self.http.aclose()
        if self._uploads is not None:
            self._uploads.close()

    async def upload(self, method: str, path: str, params: Params, data: Any) -> httpx.Response:
        """Sends ``data`` (bytes, str, a binary file, an iterable or async
        iterable of bytes) as a request's body; an error answer raises. Each
        read and write has the deadline, the transfer as a whole none.

        A streamed body goes through a synchronous httpx client on a worker
        thread: httpx 0.23 on anyio 3.6 (Debian 12's) sends a corrupt chunked
        body from an asynchronous one once a chunk fills the socket's buffer
        (the daemon read "malformed chunked encoding" for five 100,000-byte
        chunks, every time; the synchronous client, never).
        """
        headers = {"Content-Type": "application/octet-stream"}
        try:
            if isinstance(data, (bytes, bytearray, memoryview, str)):
                resp = await self.http.request(method, path, params=params, content=bytes(data.encode() if
                                               isinstance(data, str) else data), headers=headers)
            else:
                loop = asyncio.get_running_loop()
                body = _pull(data, loop) if hasattr(data, "__aiter__") else _chunks(data)
                if self._uploads is None:
                    self._uploads = httpx.Client(base_url=self.http.base_url, headers=self._headers,
                                                 transport=httpx.HTTPTransport(uds=self._unix) if self._unix else None,
                                                 timeout=httpx.Timeout(self.deadline), follow_redirects=False)
                client = self._uploads
                resp = await loop.run_in_executor(None, lambda: client.request(
                    method, path, params=params, content=body, headers=headers))
        except LINK_ERRORS as e:
            raise link_error(e, self.deadline) from e
        if resp.status_code >= 400:
            raise from_answer(resp.status_code, resp.content, dict(resp.headers))
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json_body: Any = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> httpx.Response:
        """One call, its whole answer read, within the deadline; an error
        answer raises its exception."""
        dl = Deadline(self.deadline)
        try:
            resp = await dl.within(self.http.request(method, path, params=params, json=json_body,
                                                     content=content, headers=headers))
        except LINK_ERRORS as e:
            raise link_error(e, self.deadline) from e
        if resp.status_code >= 400:
            raise from_answer(resp.status_code, resp.content, dict(resp.headers))
        return resp

    async def json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self.request(method, path, **kw)
        return resp.json() if resp.content else None

    async def open_stream(
        self,
        method: str,
        path: str,
        *,
        deadline: Deadline,
        params: Params = None,
        json_body: Any = None,
        content: Any = None,
        headers: Optional[Dict[str, str]] = None,
        base64_output: bool = False,
    ) -> httpx.Response:
        """Sends a request and reads the head of its answer within the
        deadline; the caller reads the body (see lines, chunks) and closes
        it (``await resp.aclose()``). An error answer raises."""
        # No read may outlast the whole call's deadline (httpx's default
        # would cut a command that is silent for longer than the deadline).
        req = self.http.build_request(method, path, params=params, json=json_body, content=content, headers=headers,
                                      timeout=httpx.Timeout(self.deadline, read=deadline.seconds))
        try:
            resp = await deadline.within(self.http.send(req, stream=True))
        except LINK_ERRORS as e:
            raise link_error(e, deadline.seconds) from e
        if resp.status_code >= 400:
            try:
                body = await deadline.within(resp.aread())
            except LINK_ERRORS:
                body = b""
            finally:
                await resp.aclose()
            raise from_answer(resp.status_code, body, dict(resp.headers), base64_output=base64_output)
        return resp

    async def lines(self, resp: httpx.Response, deadline: Optional[Deadline]) -> AsyncIterator[Dict[str, Any]]:
        """The JSON lines of a streamed answer (application/x-ndjson), each
        within the deadline (when given; else httpx's per-read timeout)."""
        it = resp.aiter_lines().__aiter__()
        while True:
            try:
                if deadline is not None:
                    line = await deadline.within(it.__anext__())
                else:
                    line = await it.__anext__()
            except StopAsyncIteration:
                return
            except LINK_ERRORS as e:
                raise link_error(e, deadline.seconds if deadline else self.deadline) from e
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as e:
                    raise Transport(f"the daemon sent a line that is not JSON: {line[:200]!r}") from e

    async def websocket(self, path: str, params: Params = None, *, keepalive: bool = True) -> WebSocketClientProtocol:
        """Opens a WebSocket within the deadline. A ping every quarter of the
        deadline finds a daemon that stopped answering: once a pong is a
        quarter late, the socket fails (Transport) after a quarter more for
        its closing, so within the deadline. Without ``keepalive`` the
        caller pings (see keepalive) once the daemon reads the socket."""
        query = urlencode(params, doseq=True) if params else ""
        uri = self._ws_base + path + ("?" + query if query else "")
        kw: Dict[str, Any] = dict(
            extra_headers=self._headers, create_protocol=_Protocol, open_timeout=self.deadline,
            ping_interval=self.deadline / 4 if keepalive else None, ping_timeout=self.deadline / 4,
            close_timeout=self.deadline / 4,
            max_size=32 << 20, compression=None,
        )
        if self._unix:
            kw.update(unix=True, path=self._unix)
        elif self._ssl is not None:
            kw["ssl"] = self._ssl
        try:
            ws = await Deadline(self.deadline).within(ws_connect(uri, **kw))
        except _Refused as r:
            raise from_answer(r.status, r.body, r.headers) from None
        except InvalidURI as e:
            raise Invalid(str(e)) from e
        except LINK_ERRORS as e:
            raise link_error(e, self.deadline) from e
        self._sockets.add(ws)
        return ws


async def keepalive(ws: WebSocketClientProtocol, deadline: float) -> None:
    """Pings ``ws`` as Connection.websocket's keepalive does, from now on
    (until the socket closes or the task is cancelled)."""
    while True:
        await asyncio.sleep(deadline / 4)
        try:
            pong = await ws.ping()
            await asyncio.wait_for(pong, deadline / 4)
        except asyncio.TimeoutError:
            ws.fail_connection(1011, "keepalive ping timeout")
            return
        except ConnectionClosed:
            return


def _chunks(data: Any) -> Iterator[bytes]:
    """The chunks of a binary file or an iterable of bytes."""
    if hasattr(data, "read"):
        while True:
            b = data.read(64 << 10)
            if not b:
                return
            yield b
    else:
        yield from data


def _pull(data: AsyncIterable[bytes], loop: asyncio.AbstractEventLoop) -> Iterator[bytes]:
    """The chunks of an asynchronous iterable, pulled from another thread."""
    it = data.__aiter__()
    while True:
        try:
            yield asyncio.run_coroutine_threadsafe(_next(it), loop).result()
        except StopAsyncIteration:
            return


async def _next(it: AsyncIterator[bytes]) -> bytes:
    return await it.__anext__()


def ws_closed_error(exc: ConnectionClosed) -> CorralError:
    """The exception for a WebSocket that closed without its last message."""
    rcvd = exc.rcvd
    if rcvd is not None:
        return Transport(f"the daemon closed the connection: {rcvd.code} {rcvd.reason}".rstrip())
    return Transport("the connection to the daemon was lost")


def query(*pairs: Tuple[str, Any]) -> List[Tuple[str, str]]:
    """Query parameters, leaving out those that are None."""
    out = []
    for k, v in pairs:
        if v is None:
            continue
        if isinstance(v, bool):
            v = "1" if v else "0"
        out.append((k, str(v)))
    return out
