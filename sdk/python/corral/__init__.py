"""corral: run commands, sessions, background processes and file
operations in corral's per-project sandboxes, over the daemon's HTTP API.

``Corral`` (synchronous) and ``AsyncCorral`` have the same surface::

    from corral import Corral
    with Corral() as c:                     # CORRAL_URL, CORRAL_TOKEN
        p = c.projects.create("demo")
        r = p.run(["sh", "-c", "echo hi; exit 3"])
        assert r.code == 3 and r.stdout == "hi\\n"   # a nonzero exit is a result
"""

from ._client import (AsyncCommandStream, AsyncCorral, AsyncFileReader, AsyncFiles, AsyncMessages, AsyncOutput,
                      AsyncProcess, AsyncProcesses, AsyncProject, AsyncProjects, AsyncSession, AsyncWatch,
                      OutputLimit)
from ._conn import DEFAULT_DEADLINE
from ._errors import (KINDS, Abort, BadGateway, Cleanup, Conflict, CorralError, DeadlineExceeded, Forbidden,
                      HeadMoved, Internal, Invalid, NoSpace, NotFound, NotRepository, Overflow, Prepare, RateLimited,
                      Rejected, RequestTooLarge, Start, Timeout, TooLarge, Transport, Unauthorized, UnknownRevision,
                      Unavailable, Unsupported)
from ._operations import OPERATIONS
from ._sync import (CommandStream, Corral, FileReader, Files, Messages, Output, Process, Processes, Project,
                    Projects, Session, Watch)
from ._types import (Chunk, CommandResult, EgressPolicy, ExitStatus, FileEvent, FileInfo, FileList, Limits,
                     Machine, Member, OutputEnd, ProcessInfo, ProjectInfo)

from ._conn import VERSION as __version__

__all__ = [
    "Corral", "AsyncCorral", "Projects", "AsyncProjects", "Project", "AsyncProject", "CommandStream",
    "AsyncCommandStream", "Session", "AsyncSession", "Messages", "AsyncMessages", "Processes", "AsyncProcesses",
    "Process", "AsyncProcess", "Output", "AsyncOutput", "Files", "AsyncFiles", "FileReader", "AsyncFileReader",
    "Watch", "AsyncWatch", "OutputLimit", "DEFAULT_DEADLINE",
    "Chunk", "CommandResult", "EgressPolicy", "ExitStatus", "FileEvent", "FileInfo", "FileList", "Limits",
    "Machine", "Member", "OutputEnd", "ProcessInfo", "ProjectInfo",
    "CorralError", "KINDS", "OPERATIONS", "Prepare", "Start", "Timeout", "Abort", "Overflow", "Transport",
    "DeadlineExceeded", "Cleanup", "Unauthorized", "Forbidden", "NotFound", "Invalid", "RequestTooLarge", "Conflict",
    "RateLimited", "Unavailable", "BadGateway", "Internal", "NoSpace", "Unsupported", "HeadMoved", "Rejected",
    "NotRepository", "TooLarge", "UnknownRevision",
]
