"""The synchronous client: a thin face over the asynchronous one.

A Corral owns an event loop running on a thread of its own; each method runs
the AsyncCorral coroutine of the same name there and waits for it, and each
object it answers (a project, a stream, a session…) comes back as its
synchronous twin. Callbacks (``run(on_stdout=)``) are called on that thread:
they must not call the client themselves.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any, Awaitable, Callable, Dict, Generic, Iterator, Optional, Type, TypeVar, overload

from . import _client as a
from ._conn import DEFAULT_DEADLINE
from ._types import Chunk, CommandResult, ExitStatus, FileEvent, OutputEnd, ProcessInfo, ProjectInfo

T = TypeVar("T")
F = TypeVar("F", bound="_Face")
S = TypeVar("S")


class _Loop:
    """An event loop on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="corral-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        if threading.current_thread() is self.thread:
            getattr(coro, "close", lambda: None)()
            raise RuntimeError("a corral call from one of its own callbacks: use AsyncCorral for that")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()  # an interrupt (^C) leaves nothing running
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        # What the closed connections left running (websockets' closing
        # handshakes) ends before the loop does.
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _cancel_the_rest() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# The synchronous twin of each asynchronous class.
_TWINS: Dict[type, Type["_Face"]] = {}


def _twin(async_cls: type) -> Callable[[Type["_Face"]], Type["_Face"]]:
    def register(cls: Type["_Face"]) -> Type["_Face"]:
        _TWINS[async_cls] = cls
        cls.__doc__ = cls.__doc__ or async_cls.__doc__
        return cls
    return register


def _wrap(loop: _Loop, value: Any) -> Any:
    twin = _TWINS.get(type(value))
    if twin is not None:
        return twin._of(value, loop)
    if isinstance(value, list):
        return [_wrap(loop, v) for v in value]
    return value


class _Face:
    """The twin of an asynchronous object: its data attributes read through,
    its methods declared with _blocking or _plain."""

    _a: Any
    _loop: _Loop

    @classmethod
    def _of(cls, obj: Any, loop: _Loop) -> Any:
        f = cls.__new__(cls)
        f._a, f._loop = obj, loop
        return f

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        v = getattr(self._a, name)
        if callable(v) and type(v) not in _TWINS:
            raise AttributeError(f"{type(self).__name__} has no method {name!r}")
        return _wrap(self._loop, v)

    def __repr__(self) -> str:
        return repr(self._a)


@overload
def _blocking(fn: Callable[..., Awaitable[T]]) -> Callable[..., T]: ...


@overload
def _blocking(fn: Callable[..., Awaitable[Any]], twin: Type[F]) -> Callable[..., F]: ...


def _blocking(fn: Callable[..., Awaitable[Any]], twin: Optional[type] = None) -> Callable[..., Any]:
    """The method that runs the coroutine method ``fn`` and waits for it;
    ``twin`` is the class its answer comes back as (for type checkers)."""

    def method(self: _Face, *args: Any, **kw: Any) -> Any:
        return _wrap(self._loop, self._loop.run(fn(self._a, *args, **kw)))

    method.__name__, method.__doc__, method.__wrapped__ = fn.__name__, fn.__doc__, fn  # type: ignore[attr-defined]
    return method


def _plain(fn: Callable[..., Any], twin: Type[F]) -> Callable[..., F]:
    """The method that calls ``fn``, which answers an asynchronous object,
    on the loop, and answers its twin."""

    async def call(obj: Any, *args: Any, **kw: Any) -> Any:
        return fn(obj, *args, **kw)

    def method(self: _Face, *args: Any, **kw: Any) -> Any:
        return _wrap(self._loop, self._loop.run(call(self._a, *args, **kw)))

    method.__name__, method.__doc__, method.__wrapped__ = fn.__name__, fn.__doc__, fn  # type: ignore[attr-defined]
    return method


class _Iterator(_Face, Generic[T]):
    """The twin of an asynchronous iterator with ``aclose``."""

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        try:
            return _wrap(self._loop, self._loop.run(self._a.__anext__()))
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._loop.run(self._a.aclose())

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _make_client(url: Optional[str], token: Optional[str], deadline: float) -> a.AsyncCorral:
    return a.AsyncCorral(url, token, deadline=deadline)


def _shutdown(loop: _Loop, client: a.AsyncCorral) -> None:
    try:
        loop.run(client.aclose())
    finally:
        loop.stop()


@_twin(a.AsyncCommandStream)
class CommandStream(_Iterator[Chunk]):
    result: Optional[CommandResult]


@_twin(a.AsyncSession)
class Session(_Iterator[Chunk]):
    tty: bool
    lease_id: Optional[str]
    exit: Optional[ExitStatus]

    read = _blocking(a.AsyncSession.read)
    expect = _blocking(a.AsyncSession.expect)
    write = _blocking(a.AsyncSession.write)
    close_stdin = _blocking(a.AsyncSession.close_stdin)
    resize = _blocking(a.AsyncSession.resize)
    wait = _blocking(a.AsyncSession.wait)


@_twin(a.AsyncMessages)
class Messages(_Face):
    send = _blocking(a.AsyncMessages.send)
    receive = _blocking(a.AsyncMessages.receive)
    close = _blocking(a.AsyncMessages.aclose)

    def __enter__(self) -> "Messages":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@_twin(a.AsyncOutput)
class Output(_Iterator[Chunk]):
    end: Optional[OutputEnd]
    skipped: int


@_twin(a.AsyncProcess)
class Process(_Face):
    id: str
    info: ProcessInfo

    refresh = _blocking(a.AsyncProcess.refresh)
    output = _plain(a.AsyncProcess.output, Output)
    wait = _blocking(a.AsyncProcess.wait)
    signal = _blocking(a.AsyncProcess.signal)
    kill = _blocking(a.AsyncProcess.kill)


@_twin(a.AsyncProcesses)
class Processes(_Face):
    start = _blocking(a.AsyncProcesses.start, Process)
    list = _blocking(a.AsyncProcesses.list)
    get = _blocking(a.AsyncProcesses.get, Process)


@_twin(a.AsyncFileReader)
class FileReader(_Iterator[bytes]):
    size: Optional[int]
    mode: Optional[int]

    open = _blocking(a.AsyncFileReader.open)

    def __enter__(self) -> "FileReader":
        self.open()
        return self


@_twin(a.AsyncWatch)
class Watch(_Iterator[FileEvent]):
    pass


@_twin(a.AsyncFiles)
class Files(_Face):
    read = _blocking(a.AsyncFiles.read)
    read_stream = _plain(a.AsyncFiles.read_stream, FileReader)
    write = _blocking(a.AsyncFiles.write)
    stat = _blocking(a.AsyncFiles.stat)
    list = _blocking(a.AsyncFiles.list)
    mkdir = _blocking(a.AsyncFiles.mkdir)
    remove = _blocking(a.AsyncFiles.remove)
    rename = _blocking(a.AsyncFiles.rename)
    watch = _blocking(a.AsyncFiles.watch, Watch)


@_twin(a.AsyncProject)
class Project(_Face):
    id: int
    info: Optional[ProjectInfo]
    processes: Processes
    files: Files

    refresh = _blocking(a.AsyncProject.refresh)
    delete = _blocking(a.AsyncProject.delete)
    reset = _blocking(a.AsyncProject.reset)
    set_machine = _blocking(a.AsyncProject.set_machine)
    egress = _blocking(a.AsyncProject.egress)
    set_egress = _blocking(a.AsyncProject.set_egress)
    egress_log = _blocking(a.AsyncProject.egress_log)
    members = _blocking(a.AsyncProject.members)
    add_member = _blocking(a.AsyncProject.add_member)
    run = _blocking(a.AsyncProject.run)
    stream = _plain(a.AsyncProject.stream, CommandStream)
    session = _blocking(a.AsyncProject.session, Session)
    terminal = _blocking(a.AsyncProject.terminal, Session)
    lsp = _blocking(a.AsyncProject.lsp, Messages)
    sites = _blocking(a.AsyncProject.sites)
    publish_site = _blocking(a.AsyncProject.publish_site)
    unpublish_site = _blocking(a.AsyncProject.unpublish_site)
    site_url = _blocking(a.AsyncProject.site_url)
    export = _blocking(a.AsyncProject.export)
    git_status = _blocking(a.AsyncProject.git_status)
    git_log = _blocking(a.AsyncProject.git_log)
    git_diff = _blocking(a.AsyncProject.git_diff)
    git_show = _blocking(a.AsyncProject.git_show)


@_twin(a.AsyncProjects)
class Projects(_Face):
    create = _blocking(a.AsyncProjects.create, Project)
    list = _blocking(a.AsyncProjects.list)
    get = _blocking(a.AsyncProjects.get, Project)


@_twin(a.AsyncCorral)
class Corral(_Face):
    """A client of one corral daemon, synchronous; AsyncCorral's twin.

    ``url`` is ``http(s)://host:port`` or ``unix:///path/to/corral.sock``
    and ``token`` a bearer token; either left out is read from
    ``CORRAL_URL``/``CORRAL_TOKEN``. ``deadline`` is the seconds any call
    waits for the daemon. Close it (``close()`` or ``with``).
    """

    projects: Projects

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 deadline: float = DEFAULT_DEADLINE) -> None:
        loop = _Loop()
        try:
            client = loop.run(_make_client(url, token, deadline))
        except BaseException:
            loop.stop()
            raise
        self._a, self._loop = client, loop
        self._finalizer = weakref.finalize(self, _shutdown, loop, client)

    def close(self) -> None:
        """Closes its connections and its loop. Idempotent."""
        self._finalizer()

    def __enter__(self) -> "Corral":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    project = _plain(a.AsyncCorral.project, Project)
    whoami = _blocking(a.AsyncCorral.whoami)
    health = _blocking(a.AsyncCorral.health)
    metrics = _blocking(a.AsyncCorral.metrics)
    openapi = _blocking(a.AsyncCorral.openapi)
    create_account = _blocking(a.AsyncCorral.create_account)
    create_token = _blocking(a.AsyncCorral.create_token)
    images = _blocking(a.AsyncCorral.images)
    pull_image = _blocking(a.AsyncCorral.pull_image)
