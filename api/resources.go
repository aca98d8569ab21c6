package api

import "time"

// Health is the answer of GET /healthz (its fields in the order the
// daemon has always written them).
type Health struct {
	// Sandbox is "ok", or why the sandbox domain is unavailable.
	Sandbox string `json:"sandbox"`
	// Status is "ok".
	Status string `json:"status"`
	// Store is "ok": the daemon read its store (an unreadable store
	// answers 503 "unavailable" with the store's error instead).
	Store string `json:"store"`
	// Worker is the worker's state ("connected", "none", …).
	Worker string `json:"worker"`
}

// Account is an account.
type Account struct {
	ID      int64     `json:"id"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
}

// AccountRequest is the body of POST /v1/accounts (administrators only).
type AccountRequest struct {
	Name string `json:"name"`
}

// TokenRequest is the body of POST /v1/accounts/{name}/tokens: the new
// token's name (at most 128 bytes; empty is allowed).
type TokenRequest struct {
	Name string `json:"name"`
}

// Token is a newly minted bearer token: Token is shown only this once.
type Token struct {
	ID        int64  `json:"id"`
	AccountID int64  `json:"accountId"`
	Name      string `json:"name"`
	Token     string `json:"token"`
}

// The kinds of project.
const (
	ProjectManaged = "managed" // its own machine, through the privileged worker
	ProjectHost    = "host"    // a host directory, confined by default
)

// Project is a project as its members see it.
type Project struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Kind is ProjectManaged or ProjectHost.
	Kind string `json:"kind"`
	// Root is a host project's directory (empty for managed projects: a
	// managed project's workspace is the daemon's business).
	Root    string    `json:"root,omitempty"`
	Created time.Time `json:"created"`
	// Role is the caller's role: RoleOwner or RoleMember.
	Role string `json:"role,omitempty"`
	// Machine is a managed project's machine spec (nil for host projects).
	Machine *Machine `json:"machine,omitempty"`
}

// ProjectRequest is the body of POST /v1/projects; the caller becomes the
// project's owner.
type ProjectRequest struct {
	Name string `json:"name"`
	// Kind is ProjectManaged (the default) or ProjectHost.
	Kind string `json:"kind,omitempty"`
	// Root is a host project's directory (a host path: refused unless the
	// daemon allows host paths and an admin granted them to the account).
	Root string `json:"root,omitempty"`
	// From is a host directory copied into a new managed workspace (a
	// host path, as Root).
	From string `json:"from,omitempty"`
	// Git is a URL cloned into a new managed workspace (https and http,
	// to public addresses unless the operator allowed a range; a host path
	// or file:// URL is a host path, as Root).
	Git string `json:"git,omitempty"`
	// ExportRemotes, if non-empty, are the remote patterns the project may
	// be exported to, narrowing the daemon's export remotes.
	ExportRemotes []string `json:"exportRemotes,omitempty"`
}

// Machine is a managed project's machine spec, in projects and as the
// body and answer of PUT /v1/projects/{id}/machine.
type Machine struct {
	// Image names the image of the machine's root filesystem; empty (in a
	// request) means "base". A changed image takes effect at the machine's
	// next start and discards its upper layer.
	Image string `json:"image,omitempty"`
	// Limits override the daemon's defaults; a zero or absent field means
	// the default, a negative one no limit.
	Limits Limits `json:"limits"`
}

// Limits are a machine's resource limits.
type Limits struct {
	Memory    int64 `json:"memory,omitempty"`    // bytes
	Pids      int64 `json:"pids,omitempty"`      // tasks
	CPUMillis int64 `json:"cpuMillis,omitempty"` // thousandths of a CPU
	Disk      int64 `json:"disk,omitempty"`      // bytes: workspace, home, upper layer
	Tmp       int64 `json:"tmp,omitempty"`       // bytes: /tmp and /dev/shm
}

// The roles of a member.
const (
	RoleOwner  = "owner"
	RoleMember = "member"
)

// Member is a membership of a project.
type Member struct {
	AccountID int64 `json:"accountId"`
	// Account is the account's name.
	Account string    `json:"account,omitempty"`
	Role    string    `json:"role"`
	Trusted bool      `json:"trusted"`
	Created time.Time `json:"created"`
}

// MemberRequest is the body of POST /v1/projects/{id}/members (owners
// only).
type MemberRequest struct {
	// Account is the account's name.
	Account string `json:"account"`
	// Role is RoleMember (the default) or RoleOwner.
	Role string `json:"role,omitempty"`
	// Trusted members run host commands unconfined (only where the daemon
	// allows host paths, granted by an owner who holds them).
	Trusted bool `json:"trusted,omitempty"`
}

// Site is a publication of a managed project's port, served at
// /sites/{name}/.
type Site struct {
	Name        string    `json:"name"`
	ProjectID   int64     `json:"projectId"`
	Port        int       `json:"port"`
	PublishedBy int64     `json:"publishedBy"`
	Published   time.Time `json:"published"`
}

// SiteRequest is the body of PUT /v1/projects/{id}/sites/{name}.
type SiteRequest struct {
	Port int `json:"port"`
}

// SiteURLRequest is the body of POST /v1/projects/{id}/sites/{name}/url;
// an empty body means its zero value.
type SiteURLRequest struct {
	// Path is the path (and query) the URL opens; empty means "/".
	Path string `json:"path,omitempty"`
	// ExpiresInSeconds is the URL's lifetime; zero means the daemon's
	// default (5 min), at most 1 h.
	ExpiresInSeconds int `json:"expiresInSeconds,omitempty"`
}

// SiteURL is the answer of POST /v1/projects/{id}/sites/{name}/url: a
// signed URL that opens the site on its own origin until Expires.
type SiteURL struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires"`
}

// ExportRequest is the body of POST /v1/projects/{id}/export.
//
// Remote is the URL pushed to, which must match the daemon's export
// remotes and the project's, if it has any (else 403); Branch a branch
// name (without refs/heads/); ExpectedHead the full object name the branch
// must point at (else 409 KindHeadMoved).
type ExportRequest struct {
	Remote       string `json:"remote"`
	Branch       string `json:"branch"`
	ExpectedHead string `json:"expectedHead"`
}

// ExportResult is the answer of POST /v1/projects/{id}/export.
type ExportResult struct {
	Pushed bool   `json:"pushed"`
	Head   string `json:"head"`
	Remote string `json:"remote"`
}

// EgressPolicy is a project's network policy: Mode "none" (the default:
// loopback only) or "proxy" with Allow and Deny rules (domains, "*."
// wildcards, ":port", addresses and CIDRs; deny wins), under the daemon's
// floor. Allow and Deny are never null in an answer.
type EgressPolicy struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

// EgressLogEntry is one journaled connection attempt of a machine.
type EgressLogEntry struct {
	ID         int64     `json:"id"`
	Account    int64     `json:"account"`
	Protocol   string    `json:"protocol"`
	Name       string    `json:"name"`
	Addr       string    `json:"addr"`
	Port       int       `json:"port"`
	Verdict    string    `json:"verdict"`
	Rule       string    `json:"rule"`
	Error      string    `json:"error,omitempty"`
	BytesIn    int64     `json:"bytesIn"`
	BytesOut   int64     `json:"bytesOut"`
	StartedAt  time.Time `json:"startedAt"`
	DurationMS int64     `json:"durationMs"`
}
