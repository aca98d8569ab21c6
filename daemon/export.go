package daemon

import (
	"fmt"
	"net/http"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/sandbox"
)

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
	var req api.ExportRequest
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
	writeJSON(w, http.StatusOK, api.ExportResult{Pushed: res.Pushed, Head: res.Head, Remote: res.Remote})
	return nil
}
