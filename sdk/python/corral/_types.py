"""The values the API answers, as frozen dataclasses.

Each has ``raw``: the JSON object as answered (fields a newer daemon adds
are there before this package names them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def _raw() -> Any:
    return field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Limits:
    """A machine's limits; ``None`` means the daemon's default, negative none."""

    memory: Optional[int] = None  # bytes
    pids: Optional[int] = None
    cpu_millis: Optional[int] = None  # thousandths of a CPU
    disk: Optional[int] = None  # bytes
    tmp: Optional[int] = None  # bytes

    def to_json(self) -> Dict[str, int]:
        names = {"memory": self.memory, "pids": self.pids, "cpuMillis": self.cpu_millis,
                 "disk": self.disk, "tmp": self.tmp}
        return {k: v for k, v in names.items() if v is not None}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Limits":
        return cls(memory=d.get("memory"), pids=d.get("pids"), cpu_millis=d.get("cpuMillis"),
                   disk=d.get("disk"), tmp=d.get("tmp"))


@dataclass(frozen=True)
class Machine:
    """A managed project's machine settings: its image and limits."""

    image: str = ""
    limits: Limits = Limits()
    raw: Dict[str, Any] = _raw()

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Machine":
        return cls(image=d.get("image", ""), limits=Limits.from_json(d.get("limits") or {}), raw=d)


@dataclass(frozen=True)
class ProjectInfo:
    """A project as the API describes it."""

    id: int
    name: str
    kind: str  # "managed" or "host"
    created: str
    role: Optional[str] = None  # the caller's: "owner" or "member"
    root: Optional[str] = None  # host projects
    machine: Optional[Machine] = None  # managed projects
    raw: Dict[str, Any] = _raw()

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProjectInfo":
        m = d.get("machine")
        return cls(id=d["id"], name=d["name"], kind=d["kind"], created=d.get("created", ""),
                   role=d.get("role"), root=d.get("root"),
                   machine=Machine.from_json(m) if isinstance(m, dict) else None, raw=d)


@dataclass(frozen=True)
class Member:
    account_id: int
    account: str
    role: str
    trusted: bool
    created: str
    raw: Dict[str, Any] = _raw()

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Member":
        return cls(account_id=d["accountId"], account=d.get("account", ""), role=d["role"],
                   trusted=bool(d.get("trusted")), created=d.get("created", ""), raw=d)


@dataclass(frozen=True)
class EgressPolicy:
    """``mode`` "none" (loopback only, the default) or "proxy" with rules."""

    mode: str = "none"
    allow: List[str] = field(default_factory=list)
    deny: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"mode": self.mode}
        if self.allow:
            d["allow"] = list(self.allow)
        if self.deny:
            d["deny"] = list(self.deny)
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "EgressPolicy":
        return cls(mode=d.get("mode", "none"), allow=list(d.get("allow") or []), deny=list(d.get("deny") or []))


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: exactly one of ``code`` and ``signal`` is set."""

    code: Optional[int]
    signal: Optional[str]
    oom_killed: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExitStatus":
        return cls(code=d.get("code"), signal=d.get("signal"), oom_killed=bool(d.get("oomKilled")))


@dataclass(frozen=True)
class CommandResult:
    """A completed command. A nonzero exit is a result, never an exception.

    ``stdout_bytes``/``stderr_bytes`` are the bytes it wrote (sanitized by the
    daemon like every answer); ``stdout``/``stderr`` their text, invalid
    UTF-8 replaced by U+FFFD.
    """

    code: Optional[int]
    signal: Optional[str]
    oom_killed: bool
    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """Whether it exited with status 0."""
        return self.code == 0


@dataclass(frozen=True)
class Chunk:
    """A piece of output of one stream, ending on a UTF-8 character boundary.

    ``data`` never ends inside a UTF-8 sequence (bytes that are not UTF-8
    pass through as they are), so ``text`` is never a broken character.
    ``offset`` is, for a background process, the offset of ``data[0]`` in
    its combined output (continue from ``offset + len(data)``); ``None``
    elsewhere.
    """

    stream: str  # "stdout" or "stderr"
    data: bytes
    offset: Optional[int] = None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class ProcessInfo:
    """A background process as the API describes it."""

    id: str
    project_id: int
    state: str  # running, exited, killed, timedOut, interrupted, failed
    argv: List[str]
    started: str
    ended: Optional[str]
    deadline: str
    exit: Optional[ExitStatus]
    error: Optional[Dict[str, str]]  # {"kind", "message"} once ended abnormally
    output_start: int  # first retained offset (> 0: older output fell off)
    output_end: int
    raw: Dict[str, Any] = _raw()

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProcessInfo":
        out = d.get("output") or {}
        ex = d.get("exit")
        return cls(id=d["id"], project_id=d.get("projectId", 0), state=d["state"], argv=list(d.get("argv") or []),
                   started=d.get("started", ""), ended=d.get("ended"), deadline=d.get("deadline", ""),
                   exit=ExitStatus.from_json(ex) if isinstance(ex, dict) else None, error=d.get("error"),
                   output_start=out.get("start", 0), output_end=out.get("end", 0), raw=d)


@dataclass(frozen=True)
class OutputEnd:
    """The last line of a process's output answer: where to continue, and
    the process's state (its exit once ended)."""

    offset: int
    state: str
    exit: Optional[ExitStatus]
    error: Optional[Dict[str, str]]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "OutputEnd":
        ex = d.get("exit")
        return cls(offset=d["offset"], state=d.get("state", ""),
                   exit=ExitStatus.from_json(ex) if isinstance(ex, dict) else None, error=d.get("error"))


@dataclass(frozen=True)
class FileInfo:
    name: str
    path: str  # guest path
    type: str  # file, dir, symlink, other
    size: int
    mode: int  # permission, set-id and sticky bits
    mtime: str
    target: Optional[str] = None  # a symlink's
    raw: Dict[str, Any] = _raw()

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileInfo":
        return cls(name=d["name"], path=d["path"], type=d["type"], size=d["size"], mode=int(d["mode"], 8),
                   mtime=d["mtime"], target=d.get("target"), raw=d)


@dataclass(frozen=True)
class FileList:
    dir: FileInfo
    entries: List[FileInfo]
    truncated: bool


@dataclass(frozen=True)
class FileEvent:
    """A change under a watched path, in the kernel's order."""

    type: str  # create, modify, delete, rename, overflow
    path: str = ""
    from_path: str = ""  # a rename's source
    is_dir: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileEvent":
        return cls(type=d["type"], path=d.get("path", ""), from_path=d.get("from", ""), is_dir=bool(d.get("isDir")))
