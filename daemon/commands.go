package daemon

import (
	"net/http"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// CommandRequest is the pinned body of POST /v1/projects/{id}/commands.
//
// Command must be {"type":"argv","file":F,"args":[...]}. Cwd is the working
// directory (a host path inside a host project's root, a guest path for a
// managed project; empty means the project's root). LeaseKind is one of
// editor, files, terminal, github, lsp, runner; empty means terminal.
// User (optional) names whom the command runs as in a managed project's
// machine (sandbox.ExecInput.User); empty means the machine's default
// user.
// TimeoutMs zero means sandbox.DefaultTimeout (10 s); OutputLimit zero
// means 1 MiB per stream; both are capped by AppOptions.
type CommandRequest struct {
	Command     sandbox.Command     `json:"command"`
	Cwd         string              `json:"cwd,omitempty"`
	User        string              `json:"user,omitempty"`
	LeaseKind   sandbox.LeaseKind   `json:"leaseKind,omitempty"`
	TimeoutMs   int64               `json:"timeoutMs,omitempty"`
	OutputLimit sandbox.OutputLimit `json:"outputLimit"`
}

// projectRef is the sandbox's name of a store project.
func projectRef(p store.Project) sandbox.ProjectRef {
	return sandbox.ProjectRef{Kind: sandbox.ProjectKind(p.Kind), ProjectID: p.ID}
}

// runCommand serves POST /v1/projects/{id}/commands: one bounded command,
// run by core's RunCommand as the token's account (with no extra roots).
// The request's context is the command's: a client that goes away aborts
// the command (recorded as 499).
func (a *App) runCommand(w http.ResponseWriter, r *http.Request) error {
	acct, proj, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	var req CommandRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.LeaseKind == "" {
		req.LeaseKind = sandbox.LeaseTerminal
	}
	if req.TimeoutMs < 0 {
		return apiErr(http.StatusBadRequest, KindInvalid, "timeoutMs must not be negative")
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout > a.opts.MaxTimeout || req.TimeoutMs > int64(a.opts.MaxTimeout/time.Millisecond) {
		return apiErr(http.StatusBadRequest, KindInvalid, "timeoutMs must not exceed %d", a.opts.MaxTimeout.Milliseconds())
	}
	l := req.OutputLimit
	if l.Stdout > a.opts.MaxOutput || l.Stderr > a.opts.MaxOutput || l.Combined > a.opts.MaxOutput {
		return apiErr(http.StatusBadRequest, KindInvalid, "output limits must not exceed %d bytes", a.opts.MaxOutput)
	}
	ctl, err := a.core.Sandbox()
	if err != nil {
		return err
	}
	// The command's output stays in memory until its response is written:
	// reserve it (429 over the budget) until then, not only while it runs.
	ticket, err := ctl.Admit(r.Context(), sandbox.Admission{Kind: sandbox.AdmitCommand, Account: acct.ID, Bytes: reservedBytes(l)})
	if err != nil {
		return err
	}
	defer ticket.Release()
	in := sandbox.ExecInput{Command: req.Command, Cwd: req.Cwd, User: req.User, LeaseKind: req.LeaseKind, Project: projectRef(proj)}
	res, err := ctl.RunCommand(sandbox.WithTicket(r.Context(), ticket), in, &sandbox.Actor{AccountUserID: acct.ID}, &sandbox.RunOptions{
		Timeout:     timeout,
		OutputLimit: l,
	})
	if err != nil {
		// Written here, while the partial output is still reserved.
		a.writeFailure(w, r, err)
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// reservedBytes is what a command with limit l reserves: its limits with
// sandbox's defaults (1 MiB per stream) applied.
func reservedBytes(l sandbox.OutputLimit) int64 {
	if l.Combined > 0 {
		return l.Combined
	}
	n := int64(0)
	for _, v := range []int64{l.Stdout, l.Stderr} {
		if v == 0 {
			v = sandbox.DefaultStreamLimit
		}
		n += v
	}
	return n
}
