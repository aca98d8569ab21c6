// The client: accounts, projects and everything done in a project.

import { Caller, projectPath, Query } from "./caller.js";
import { CommandStream, run, RunOptions, RunResult, streamed } from "./command.js";
import { CorralError } from "./errors.js";
import { Files } from "./files.js";
import { Processes } from "./process.js";
import { LSPSession, Session, SessionOptions } from "./session.js";
import { parseEndpoint } from "./transport.js";
import type {
  Account,
  Image,
  CallOptions,
  EgressLogEntry,
  EgressPolicy,
  ExportRequest,
  ExportResult,
  Health,
  Machine,
  Member,
  MemberRequest,
  ProjectInfo,
  ProjectRequest,
  Site,
  SiteURL,
  Token,
} from "./types.js";

export interface CorralOptions {
  /**
   * The daemon: http(s)://host:port, or unix:///path/to/corral.sock (Node).
   * Default: $CORRAL_URL.
   */
  url?: string;
  /** The bearer token. Default: $CORRAL_TOKEN. */
  token?: string;
  /**
   * The client-side deadline of every call, in milliseconds (default 60 s;
   * 0 for none): a call the daemon does not answer in time fails with a
   * DeadlineError instead of hanging. Commands default to their timeout
   * plus 45 s. Each call's `deadlineMs` overrides it.
   */
  deadlineMs?: number;
  /** The fetch to use for http(s) URLs (default the platform's). */
  fetch?: typeof fetch;
  /**
   * Milliseconds between the liveness checks of open streams: a ping on
   * WebSockets (sessions, terminals, watches, language servers; Node only),
   * a getProcess beside a followed process output. A daemon that answers
   * none in time is gone, and the stream fails with a DeadlineError (default
   * 15 s; 0 for none).
   */
  keepaliveMs?: number;
}

function env(name: string): string | undefined {
  return typeof process !== "undefined" ? process.env?.[name] : undefined;
}

/**
 * Corral is a client of a corral daemon.
 *
 *     const corral = new Corral(); // $CORRAL_URL, $CORRAL_TOKEN
 *     const project = await corral.projects.create({ name: "demo" });
 *     const r = await project.run(["echo", "hello"]);
 */
export class Corral {
  /** The account's projects. */
  readonly projects: Projects;
  private readonly c: Caller;

  constructor(o: CorralOptions = {}) {
    const url = o.url ?? env("CORRAL_URL");
    if (!url) throw new CorralError("invalid", "corral: no daemon URL: pass {url} or set CORRAL_URL (http://host:port or unix:///path/to/corral.sock)");
    this.c = new Caller(parseEndpoint(url), o.token ?? env("CORRAL_TOKEN") ?? "", o.deadlineMs ?? 60_000, o.fetch, o.keepaliveMs ?? 15_000);
    this.projects = new Projects(this.c);
  }

  /** The daemon's health (getHealth); an unhealthy daemon is an UnavailableError. */
  health(o: CallOptions = {}): Promise<Health> {
    return this.c.json("GET", "/healthz", {}, o);
  }

  /** The Prometheus metrics (getMetrics). */
  async metrics(o: CallOptions = {}): Promise<string> {
    return this.text("GET", "/metrics", {}, o);
  }

  /** The API's OpenAPI document as the daemon serves it (getOpenAPI). */
  openapi(o: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.c.json("GET", "/openapi.json", {}, o);
  }

  /** The token's account (whoami). */
  whoami(o: CallOptions = {}): Promise<Account> {
    return this.c.json("GET", "/v1/whoami", {}, o);
  }

  /** Creates an account (createAccount; the daemon's administrators only). */
  createAccount(name: string, o: CallOptions = {}): Promise<Account> {
    return this.c.json("POST", "/v1/accounts", { json: { name } }, o);
  }

  /** Mints a token for `account` (createToken): any account for itself, an administrator for any. */
  createToken(account: string, o: CallOptions & { name?: string } = {}): Promise<Token> {
    const body: Record<string, unknown> = {};
    if (o.name !== undefined) body.name = o.name;
    return this.c.json("POST", `/v1/accounts/${encodeURIComponent(account)}/tokens`, { json: body }, o);
  }

  /** The machines' images in the daemon's store (listImages; the daemon's administrators only). */
  images(o: CallOptions = {}): Promise<Image[]> {
    return this.c.json("GET", "/v1/images", {}, o);
  }

  /**
   * Pulls `ref` from its registry into the daemon's image store (pullImage; the daemon's
   * administrators only) under `name` (default: the last part of the repository), replacing an
   * image of that name; projects then use it by name (`setMachine({image})`). A registry that
   * cannot be reached or has no such image throws a BadGatewayError.
   */
  pullImage(ref: string, o: CallOptions & { name?: string } = {}): Promise<Image> {
    const body: Record<string, unknown> = { ref };
    if (o.name !== undefined) body.name = o.name;
    return this.c.json("POST", "/v1/images", { json: body }, o);
  }

  /** A handle on project `id`, without asking the daemon (use `projects.get` for its description). */
  project(id: number): Project {
    return new Project(this.c, { id } as ProjectInfo);
  }

  /**
   * A request to a published site through the daemon's gateway, as a member
   * (siteGet, sitePost, …; `path` "" asks /sites/{name}, which redirects to
   * its root): the site's Response, whatever its status.
   */
  async site(name: string, path = "/", init: { method?: string; headers?: Record<string, string>; body?: Uint8Array | string } & CallOptions = {}): Promise<Response> {
    const p = `/sites/${encodeURIComponent(name)}` + (path === "" ? "" : "/" + path.replace(/^\/+/, ""));
    const { res, deadline, what } = await this.c.open(init.method ?? "GET", p, { body: init.body, headers: init.headers, anyStatus: true }, init);
    try {
      const body = new Uint8Array(await res.arrayBuffer());
      const nullBody = res.status === 204 || res.status === 304 || init.method === "HEAD";
      return new Response(nullBody ? null : body, { status: res.status, statusText: res.statusText, headers: res.headers });
    } catch (err) {
      throw deadline.error(what, err);
    } finally {
      deadline.done();
    }
  }

  private async text(method: string, path: string, q: Query, o: CallOptions): Promise<string> {
    const { res, deadline, what } = await this.c.open(method, path, { query: q }, o);
    try {
      return await res.text();
    } catch (err) {
      throw deadline.error(what, err);
    } finally {
      deadline.done();
    }
  }
}

/** The account's projects. */
export class Projects {
  constructor(private readonly c: Caller) {}

  /** Creates a project owned by the caller (createProject): managed and empty by default. */
  async create(req: ProjectRequest, o: CallOptions = {}): Promise<Project> {
    return new Project(this.c, await this.c.json<ProjectInfo>("POST", "/v1/projects", { json: req }, o));
  }

  /** The caller's projects (listProjects). */
  async list(o: CallOptions = {}): Promise<Project[]> {
    const ps = await this.c.json<ProjectInfo[]>("GET", "/v1/projects", {}, o);
    return ps.map((p) => new Project(this.c, p));
  }

  /** One project (getProject): a ForbiddenError for one the caller is not a member of, or that does not exist. */
  async get(id: number, o: CallOptions = {}): Promise<Project> {
    return new Project(this.c, await this.c.json<ProjectInfo>("GET", projectPath(id), {}, o));
  }

  /** Deletes a project and its workspace (deleteProject; owners): a ConflictError while it has live leases. */
  async delete(id: number, o: CallOptions = {}): Promise<void> {
    await this.c.json("DELETE", projectPath(id), {}, o);
  }

  /** Discards what the machine's root changed outside the workspace and home (resetMachine; owners and admins). */
  async reset(id: number, o: CallOptions = {}): Promise<void> {
    await this.c.json("POST", projectPath(id, "reset"), {}, o);
  }

  /** Sets a managed project's machine image and limits (setMachine; owners and admins); answers them as stored. */
  setMachine(id: number, machine: Machine, o: CallOptions = {}): Promise<Machine> {
    return this.c.json("PUT", projectPath(id, "machine"), { json: machine }, o);
  }

  /** The project's network policy (getEgress). */
  egress(id: number, o: CallOptions = {}): Promise<EgressPolicy> {
    return this.c.json("GET", projectPath(id, "egress"), {}, o);
  }

  /** Sets the project's network policy (setEgress; owners and admins). */
  setEgress(id: number, policy: EgressPolicy, o: CallOptions = {}): Promise<EgressPolicy> {
    return this.c.json("PUT", projectPath(id, "egress"), { json: policy }, o);
  }

  /** The machine's recent outbound connection attempts, newest first (getEgressLog). */
  egressLog(id: number, o: CallOptions & { limit?: number } = {}): Promise<EgressLogEntry[]> {
    return this.c.json("GET", projectPath(id, "egress", "log"), { query: { limit: o.limit } }, o);
  }

  /** The project's members (listMembers). */
  members(id: number, o: CallOptions = {}): Promise<Member[]> {
    return this.c.json("GET", projectPath(id, "members"), {}, o);
  }

  /** Adds a member (addMember; owners). */
  addMember(id: number, req: MemberRequest, o: CallOptions = {}): Promise<Member> {
    return this.c.json("POST", projectPath(id, "members"), { json: req }, o);
  }
}

/** A project's published sites. */
export class Sites {
  constructor(
    private readonly c: Caller,
    readonly projectId: number,
  ) {}

  /** The project's sites (listSites). */
  list(o: CallOptions = {}): Promise<Site[]> {
    return this.c.json("GET", projectPath(this.projectId, "sites"), {}, o);
  }

  /** Publishes a port of the machine as site `name` (publishSite). */
  publish(name: string, port: number, o: CallOptions = {}): Promise<Site> {
    return this.c.json("PUT", projectPath(this.projectId, "sites", name), { json: { port } }, o);
  }

  /** Unpublishes site `name` (unpublishSite). */
  async unpublish(name: string, o: CallOptions = {}): Promise<void> {
    await this.c.json("DELETE", projectPath(this.projectId, "sites", name), {}, o);
  }

  /** Mints a signed URL that opens the site in a browser on its own origin (createSiteURL). */
  url(name: string, o: CallOptions & { path?: string; expiresInSeconds?: number } = {}): Promise<SiteURL> {
    const body: Record<string, unknown> = {};
    if (o.path !== undefined) body.path = o.path;
    if (o.expiresInSeconds !== undefined) body.expiresInSeconds = o.expiresInSeconds;
    return this.c.json("POST", projectPath(this.projectId, "sites", name, "url"), { json: body }, o);
  }
}

/** Read-only Git of a project's workspace. */
export class Git {
  constructor(
    private readonly c: Caller,
    readonly projectId: number,
  ) {}

  /** gitStatus. */
  status(o: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.c.json("GET", projectPath(this.projectId, "git", "status"), {}, o);
  }

  /** A page of history (gitLog). */
  log(q: { ref?: string; skip?: number; limit?: number; path?: string } = {}, o: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.c.json("GET", projectPath(this.projectId, "git", "log"), { query: q }, o);
  }

  /** A unified diff (gitDiff). */
  diff(q: { from?: string; to?: string; staged?: boolean; path?: string; max?: number } = {}, o: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.c.json("GET", projectPath(this.projectId, "git", "diff"), { query: q }, o);
  }

  /** A file at a ref (gitShow). */
  show(q: { ref?: string; path: string; max?: number }, o: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.c.json("GET", projectPath(this.projectId, "git", "show"), { query: q }, o);
  }
}

/**
 * Project is a handle on one project: its description as last read, and
 * everything done in it.
 */
export class Project {
  readonly id: number;
  /** Its description as last read (only `id` for a handle from `corral.project(id)`). */
  info: ProjectInfo;
  /** Its background processes. */
  readonly processes: Processes;
  /** Its files. */
  readonly files: Files;
  /** Its published sites. */
  readonly sites: Sites;
  /** Read-only Git of its workspace. */
  readonly git: Git;
  private readonly projects: Projects;

  constructor(
    private readonly c: Caller,
    info: ProjectInfo,
  ) {
    this.id = info.id;
    this.info = info;
    this.processes = new Processes(c, info.id);
    this.files = new Files(c, info.id);
    this.sites = new Sites(c, info.id);
    this.git = new Git(c, info.id);
    this.projects = new Projects(c);
  }

  get name(): string {
    return this.info.name;
  }

  /** Reads its description again (getProject). */
  async refresh(o: CallOptions = {}): Promise<ProjectInfo> {
    this.info = (await this.projects.get(this.id, o)).info;
    return this.info;
  }

  /**
   * Runs a bounded command and answers its result once it completed
   * (runCommand). A nonzero exit or a death by a signal is a result; a
   * command that did not complete is an error of its kind (TimeoutError,
   * OverflowError, StartError, …) carrying its partial output.
   */
  run(argv: string[], o: RunOptions = {}): Promise<RunResult> {
    return run(this.c, this.id, argv, o);
  }

  /** Runs a bounded command and streams its output as it arrives (runCommand, NDJSON). */
  stream(argv: string[], o: Omit<RunOptions, "onStdout" | "onStderr"> = {}): CommandStream {
    return new CommandStream(streamed(this.c, this.id, argv, o));
  }

  /** Opens a session: a command with its stdin, stdout and stderr over a WebSocket (openSession). */
  session(argv: string[], o: SessionOptions = {}): Promise<Session> {
    return Session.open(this.c, this.id, argv, o);
  }

  /** Opens a terminal: `argv` (default /bin/sh) on a PTY of rows × cols (openSession with tty). */
  terminal(o: Omit<SessionOptions, "tty"> & { argv?: string[]; rows?: number; cols?: number } = {}): Promise<Session> {
    return Session.open(this.c, this.id, o.argv ?? ["/bin/sh"], { ...o, tty: { rows: o.rows, cols: o.cols } });
  }

  /** Opens a language server's session (openLSPSession). */
  async lsp(server = "gopls", o: CallOptions = {}): Promise<LSPSession> {
    return new LSPSession(await this.c.socket(projectPath(this.id, "lsp", server), {}, "lsp " + server, o));
  }

  /** Pushes a branch of the workspace to a Git remote with the daemon's credentials (exportBranch). */
  export(req: ExportRequest, o: CallOptions = {}): Promise<ExportResult> {
    return this.c.json("POST", projectPath(this.id, "export"), { json: req }, o);
  }

  delete(o: CallOptions = {}): Promise<void> {
    return this.projects.delete(this.id, o);
  }

  reset(o: CallOptions = {}): Promise<void> {
    return this.projects.reset(this.id, o);
  }

  setMachine(machine: Machine, o: CallOptions = {}): Promise<Machine> {
    return this.projects.setMachine(this.id, machine, o);
  }

  egress(o: CallOptions = {}): Promise<EgressPolicy> {
    return this.projects.egress(this.id, o);
  }

  setEgress(policy: EgressPolicy, o: CallOptions = {}): Promise<EgressPolicy> {
    return this.projects.setEgress(this.id, policy, o);
  }

  egressLog(o: CallOptions & { limit?: number } = {}): Promise<EgressLogEntry[]> {
    return this.projects.egressLog(this.id, o);
  }

  members(o: CallOptions = {}): Promise<Member[]> {
    return this.projects.members(this.id, o);
  }

  addMember(req: MemberRequest, o: CallOptions = {}): Promise<Member> {
    return this.projects.addMember(this.id, req, o);
  }
}
