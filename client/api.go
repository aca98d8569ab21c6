package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/corral-sandbox/corral/api"
)

// This file holds one method per operation of the daemon's API
// (docs/openapi.json names each by its operationId). Every method returns
// a *Error for an error answer of the daemon (match it with errors.Is
// against ErrUnauthorized, ErrForbidden, …, or errors.As for its status,
// message and Retry-After) and a wrapped transport error otherwise.

// projectPath is "/v1/projects/{id}" followed by the escaped segments.
func projectPath(id int64, segments ...string) string {
	p := "/v1/projects/" + strconv.FormatInt(id, 10)
	for _, s := range segments {
		p += "/" + url.PathEscape(s)
	}
	return p
}

// Health is the answer of GET /healthz.
type Health = api.Health

// Health reports the daemon's health (getHealth). An unhealthy daemon
// answers a *Error with Status 503 and the reason.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.Do(ctx, http.MethodGet, "/healthz", nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Account is an account as the API shows it.
type Account = api.Account

// Whoami returns the client's own account (whoami).
func (c *Client) Whoami(ctx context.Context) (*Account, error) {
	var a Account
	if err := c.Do(ctx, http.MethodGet, "/v1/whoami", nil, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// CreateAccount creates an account (createAccount; the daemon's
// administrators only: 403 for others, 409 for a name that exists).
func (c *Client) CreateAccount(ctx context.Context, name string) (*Account, error) {
	var a Account
	if err := c.Do(ctx, http.MethodPost, "/v1/accounts", api.AccountRequest{Name: name}, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Token is a newly minted bearer token; Token is shown only this once.
type Token = api.Token

// CreateToken mints a token named name for account (createToken): any
// account for itself, an administrator for any account.
func (c *Client) CreateToken(ctx context.Context, account, name string) (*Token, error) {
	var t Token
	if err := c.Do(ctx, http.MethodPost, "/v1/accounts/"+url.PathEscape(account)+"/tokens", api.TokenRequest{Name: name}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Project returns project id (getProject).
func (c *Client) Project(ctx context.Context, id int64) (*Project, error) {
	var p Project
	if err := c.Do(ctx, http.MethodGet, projectPath(id), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// DeleteProject deletes project id and its workspace (deleteProject;
// owners; 409 while a lease is live).
func (c *Client) DeleteProject(ctx context.Context, id int64) error {
	return c.Do(ctx, http.MethodDelete, projectPath(id), nil, nil)
}

// Machine is a managed project's machine spec.
type Machine = api.Machine

// Limits are a machine's resource limits.
type Limits = api.Limits

// SetMachine records project id's machine spec and returns it as stored
// (setMachine; owners and admins; 400 for a host project).
func (c *Client) SetMachine(ctx context.Context, id int64, m Machine) (*Machine, error) {
	var out Machine
	if err := c.Do(ctx, http.MethodPut, projectPath(id, "machine"), m, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ResetMachine discards project id's machine state (resetMachine; owners
// and admins; 409 while the project has live leases, 503 without a
// worker).
func (c *Client) ResetMachine(ctx context.Context, id int64) error {
	return c.Do(ctx, http.MethodPost, projectPath(id, "reset"), nil, nil)
}

// Member is a membership as the API shows it.
type Member = api.Member

// Members lists project id's members (listMembers).
func (c *Client) Members(ctx context.Context, id int64) ([]Member, error) {
	var ms []Member
	if err := c.Do(ctx, http.MethodGet, projectPath(id, "members"), nil, &ms); err != nil {
		return nil, err
	}
	return ms, nil
}

// Site is a publication of a managed project's port.
type Site = api.Site

// Sites lists project id's sites (listSites).
func (c *Client) Sites(ctx context.Context, id int64) ([]Site, error) {
	var ss []Site
	if err := c.Do(ctx, http.MethodGet, projectPath(id, "sites"), nil, &ss); err != nil {
		return nil, err
	}
	return ss, nil
}

// UnpublishSite removes project id's site name (unpublishSite).
func (c *Client) UnpublishSite(ctx context.Context, id int64, name string) error {
	return c.Do(ctx, http.MethodDelete, projectPath(id, "sites", name), nil, nil)
}

// ExportRequest is the body of Export.
type ExportRequest = api.ExportRequest

// ExportResult is the answer of Export.
type ExportResult = api.ExportResult

// Export pushes a branch of project id's workspace to a remote
// (exportBranch): 409 with kind "headMoved" if the branch is not at
// ExpectedHead, 403 for a remote the daemon or project does not allow.
func (c *Client) Export(ctx context.Context, id int64, req ExportRequest) (*ExportResult, error) {
	var out ExportResult
	if err := c.Do(ctx, http.MethodPost, projectPath(id, "export"), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Git runs one of the editor's read-only Git reads of project id (gitStatus,
// gitLog, gitDiff, gitShow: read is "status", "log", "diff" or "show") with
// the query q (nil for none) and decodes the answer into out.
func (c *Client) Git(ctx context.Context, id int64, read string, q url.Values, out any) error {
	p := projectPath(id, "git", read)
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	return c.Do(ctx, http.MethodGet, p, nil, out)
}

// EgressPolicy is a project's network policy: Mode "none" (loopback only)
// or "proxy" with Allow and Deny rules.
type EgressPolicy = api.EgressPolicy

// Egress returns project id's network policy (getEgress).
func (c *Client) Egress(ctx context.Context, id int64) (*EgressPolicy, error) {
	var p EgressPolicy
	if err := c.Do(ctx, http.MethodGet, projectPath(id, "egress"), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// SetEgress sets project id's network policy and returns it as stored
// (setEgress; owners and admins; 400 for a bad rule).
func (c *Client) SetEgress(ctx context.Context, id int64, p EgressPolicy) (*EgressPolicy, error) {
	var out EgressPolicy
	if err := c.Do(ctx, http.MethodPut, projectPath(id, "egress"), p, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// EgressLogEntry is one journaled connection attempt of a machine.
type EgressLogEntry = api.EgressLogEntry

// EgressLog returns the newest limit (1…1000; 0 means the daemon's
// default, 100) connection attempts of project id's machine, newest first
// (getEgressLog).
func (c *Client) EgressLog(ctx context.Context, id int64, limit int) ([]EgressLogEntry, error) {
	p := projectPath(id, "egress", "log")
	if limit != 0 {
		p += "?limit=" + strconv.Itoa(limit)
	}
	var out []EgressLogEntry
	if err := c.Do(ctx, http.MethodGet, p, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}
