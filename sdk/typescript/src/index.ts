// corral's TypeScript SDK. See README.md.

export { Corral, Projects, Project, Sites, Git } from "./client.js";
export type { CorralOptions } from "./client.js";
export { CommandStream, RunResult } from "./command.js";
export type { RunOptions } from "./command.js";
export { Processes, Process, ProcessOutput } from "./process.js";
export type { StartOptions, OutputOptions } from "./process.js";
export { Files, FileWatch, readAll } from "./files.js";
export type { FileOptions, FileStream, FileData } from "./files.js";
export { Session, LSPSession } from "./session.js";
export type { SessionOptions } from "./session.js";
export * from "./errors.js";
export type * from "./types.js";

/**
 * OPERATIONS names the method that covers each operation of the API
 * (docs/openapi.json's operationIds), as "Class.method". A test fails when
 * the document has an operation this table does not name, or names a method
 * that does not exist.
 */
export const OPERATIONS: Readonly<Record<string, string>> = Object.freeze({
  getHealth: "Corral.health",
  getMetrics: "Corral.metrics",
  getOpenAPI: "Corral.openapi",
  whoami: "Corral.whoami",
  createAccount: "Corral.createAccount",
  createToken: "Corral.createToken",
  listImages: "Corral.images",
  pullImage: "Corral.pullImage",
  listProjects: "Projects.list",
  createProject: "Projects.create",
  getProject: "Projects.get",
  deleteProject: "Projects.delete",
  setMachine: "Projects.setMachine",
  resetMachine: "Projects.reset",
  listMembers: "Projects.members",
  addMember: "Projects.addMember",
  getEgress: "Projects.egress",
  setEgress: "Projects.setEgress",
  getEgressLog: "Projects.egressLog",
  runCommand: "Project.run",
  openSession: "Project.session",
  openLSPSession: "Project.lsp",
  exportBranch: "Project.export",
  listSites: "Sites.list",
  publishSite: "Sites.publish",
  unpublishSite: "Sites.unpublish",
  createSiteURL: "Sites.url",
  siteRedirectGet: "Corral.site",
  siteRedirectHead: "Corral.site",
  siteRedirectPost: "Corral.site",
  siteRedirectPut: "Corral.site",
  siteRedirectPatch: "Corral.site",
  siteRedirectDelete: "Corral.site",
  siteRedirectOptions: "Corral.site",
  siteGet: "Corral.site",
  siteHead: "Corral.site",
  sitePost: "Corral.site",
  sitePut: "Corral.site",
  sitePatch: "Corral.site",
  siteDelete: "Corral.site",
  siteOptions: "Corral.site",
  gitStatus: "Git.status",
  gitLog: "Git.log",
  gitDiff: "Git.diff",
  gitShow: "Git.show",
  getFile: "Files.read",
  putFile: "Files.write",
  statFile: "Files.stat",
  listFiles: "Files.list",
  makeDirectory: "Files.mkdir",
  removeFile: "Files.remove",
  renameFile: "Files.rename",
  watchFiles: "Files.watch",
  startProcess: "Processes.start",
  listProcesses: "Processes.list",
  getProcess: "Processes.get",
  deleteProcess: "Process.kill",
  getProcessOutput: "Process.output",
  signalProcess: "Process.signal",
});

/**
 * NOT_COVERED says why an operation of the API has no method: it serves
 * another kind of client.
 */
export const NOT_COVERED: Readonly<Record<string, string>> = Object.freeze({
  mcp: "the Model Context Protocol endpoint, for MCP clients (agents): point one at /v1/mcp with a bearer token",
});
