package daemon

import (
	"fmt"
	"net/http"

	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/sandbox"
)

// Kinds of APIError specific to POST /v1/projects/{id}/export.
const (
	KindHeadMoved     = "headMoved"     // 409: the branch is not at expectedHead
	KindRejected      = "rejected"      // 409: the remote refused the push
	KindNotRepository = "notRepository" // 409: the workspace is not a Git repository
	KindTooLarge      = "tooLarge"      // 413: the bundle is over the cap
)

// ExportRequest is the body of POST /v1/projects/{id}/export.
//
// Remote is the URL pushed to (https; with AppOptions.Export.AllowInsecure
// also http, file and absolute host paths), which must match the daemon's
// export remotes and the project's, if it has any (else 403); Branch a branch name (without
// refs/heads/); ExpectedHead the full object name the branch must point at.
type ExportRequest struct {
	Remote       string `json:"remote"`
	Branch       string `json:"branch"`
	ExpectedHead string `json:"expectedHead"`
}

// startExport builds the app's exporter and starts its sweeper, which runs
// until Close.
func (a *App) startExport() error {
	xopts := a.opts.Export
	if xopts.Logger == nil {
		xopts.Logger = a.log
	}
	x, err := export.New(a.core, xopts)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	a.exporter = x
	sw := x.Sweeper(a.opts.ExportSweep)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		_ = sw.Run(a.ctx)
	}()
	return nil
}

// exportBranch serves POST /v1/projects/{id}/export: the caller must be a
// member (401/403/404 are decided from the database before anything runs
// in the machine). It answers 200 with {"pushed":true,"head":H,"remote":R}
// (R without user information).
func (a *App) exportBranch(w http.ResponseWriter, r *http.Request) error {
	acct, proj, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	var req ExportRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	res, err := a.exporter.Export(r.Context(), export.Request{
		Actor:        sandbox.Actor{AccountUserID: acct.ID},
		Project:      proj.ID,
		Remote:       req.Remote,
		Branch:       req.Branch,
		ExpectedHead: req.ExpectedHead,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}
