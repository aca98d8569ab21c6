"""Which method covers each operation of the API (docs/openapi.json's
operationIds). A test fails when the document has an operation this table
does not name, or names a method that AsyncCorral or Corral lacks.

A value is "Class.method" of the asynchronous classes (the synchronous twin
has the same name without "Async"), or None with the reason in NOT_COVERED.
"""

from typing import Dict, Optional

OPERATIONS: Dict[str, Optional[str]] = {
    "getHealth": "AsyncCorral.health",
    "getMetrics": "AsyncCorral.metrics",
    "getOpenAPI": "AsyncCorral.openapi",
    "whoami": "AsyncCorral.whoami",
    "createAccount": "AsyncCorral.create_account",
    "createToken": "AsyncCorral.create_token",
    "listImages": "AsyncCorral.images",
    "pullImage": "AsyncCorral.pull_image",
    "listProjects": "AsyncProjects.list",
    "createProject": "AsyncProjects.create",
    "getProject": "AsyncProjects.get",
    "deleteProject": "AsyncProject.delete",
    "setMachine": "AsyncProject.set_machine",
    "resetMachine": "AsyncProject.reset",
    "listMembers": "AsyncProject.members",
    "addMember": "AsyncProject.add_member",
    "runCommand": "AsyncProject.run",
    "openSession": "AsyncProject.session",
    "openLSPSession": "AsyncProject.lsp",
    "listSites": "AsyncProject.sites",
    "publishSite": "AsyncProject.publish_site",
    "unpublishSite": "AsyncProject.unpublish_site",
    "createSiteURL": "AsyncProject.site_url",
    "exportBranch": "AsyncProject.export",
    "gitStatus": "AsyncProject.git_status",
    "gitLog": "AsyncProject.git_log",
    "gitDiff": "AsyncProject.git_diff",
    "gitShow": "AsyncProject.git_show",
    "getEgress": "AsyncProject.egress",
    "setEgress": "AsyncProject.set_egress",
    "getEgressLog": "AsyncProject.egress_log",
    "getFile": "AsyncFiles.read",
    "putFile": "AsyncFiles.write",
    "statFile": "AsyncFiles.stat",
    "listFiles": "AsyncFiles.list",
    "makeDirectory": "AsyncFiles.mkdir",
    "removeFile": "AsyncFiles.remove",
    "renameFile": "AsyncFiles.rename",
    "watchFiles": "AsyncFiles.watch",
    "startProcess": "AsyncProcesses.start",
    "listProcesses": "AsyncProcesses.list",
    "getProcess": "AsyncProcesses.get",
    "deleteProcess": "AsyncProcess.kill",
    "getProcessOutput": "AsyncProcess.output",
    "signalProcess": "AsyncProcess.signal",
}

_SITE_TRAFFIC = "a site's own traffic, for browsers (open it with AsyncProject.site_url)"
for _method in ("Get", "Head", "Post", "Put", "Patch", "Delete", "Options"):
    OPERATIONS["siteRedirect" + _method] = None
    OPERATIONS["site" + _method] = None

OPERATIONS["mcp"] = None

#: Why an operation has no method.
NOT_COVERED: Dict[str, str] = {op: _SITE_TRAFFIC for op, m in OPERATIONS.items() if m is None}
NOT_COVERED["mcp"] = "the Model Context Protocol endpoint, for MCP clients (agents): point one at /v1/mcp with a bearer token"
