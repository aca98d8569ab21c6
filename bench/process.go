package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/store"
)

// Background processes: start → first output. One sample is a POST
// /v1/projects/{id}/processes of `sh -c 'echo ready'` and a followed GET
// …/output from offset 0 until its first chunk, through a real daemon app
// on a Unix socket over cr's core (the client's two requests, the
// preparation, the start, the ring and the follow). The process then ends
// by itself; the daemon keeps a bounded number of ended ones.

// processDaemon is a daemon app serving cr's core on a Unix socket, with a
// token of alice's.
type processDaemon struct {
	c    *client.Client
	stop func()
}

// startProcessDaemon serves a daemon app over cr.core.
func startProcessDaemon(cr *corral) (*processDaemon, error) {
	app, err := daemon.BuildApp(cr.core, daemon.AppOptions{
		Logger:                 slog.New(slog.DiscardHandler),
		MaxProcessesPerProject: 1 << 12,
		MaxProcessesPerAccount: 1 << 12,
	})
	if err != nil {
		return nil, err
	}
	sockDir, err := os.MkdirTemp("", "cb")
	if err != nil {
		app.Close()
		return nil, err
	}
	sock := filepath.Join(sockDir, "corral.sock")
	ln, err := daemon.ListenUnix(sock, daemon.SocketMode)
	if err != nil {
		app.Close()
		os.RemoveAll(sockDir)
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.Serve(ctx, app, []net.Listener{ln}, slog.New(slog.DiscardHandler)) }()
	stop := func() {
		cancel()
		<-done
		app.Close()
		os.RemoveAll(sockDir)
	}
	tok, _, err := cr.st.CreateToken(context.Background(), cr.alice.AccountUserID, "bench")
	if err != nil {
		stop()
		return nil, err
	}
	c, err := client.New(sock, tok)
	if err != nil {
		stop()
		return nil, err
	}
	return &processDaemon{c: c, stop: stop}, nil
}

// errFirstChunk stops reading the output at its first chunk.
var errFirstChunk = errors.New("first chunk")

// firstOutput starts a background process in p and waits for its first
// output chunk.
func (d *processDaemon) firstOutput(ctx context.Context, p store.Project) error {
	pr, err := d.c.StartProcess(ctx, p.ID, client.ProcessRequest{Argv: []string{"sh", "-c", "echo ready"}})
	if err != nil {
		return err
	}
	var got string
	_, err = d.c.ProcessOutput(ctx, p.ID, pr.ID, client.OutputOptions{Follow: true}, func(ch client.OutputChunk) error {
		got = string(ch.Data)
		return errFirstChunk
	})
	if !errors.Is(err, errFirstChunk) {
		if err == nil {
			err = errors.New("the process ended without output")
		}
		return err
	}
	if got != "ready\n" {
		return fmt.Errorf("first chunk %q, want %q", got, "ready\n")
	}
	return nil
}

// processSubjects returns the "background start → first output" subjects
// (a confined host project, and the warm managed project when cr has a
// worker) for measureLatency, and the function that stops their daemon.
func processSubjects(ctx context.Context, cr *corral) ([]subject, func(), error) {
	d, err := startProcessDaemon(cr)
	if err != nil {
		return nil, nil, err
	}
	subjects := []subject{{
		name: "background process start → first output, host (confined)",
		run:  func() error { return d.firstOutput(ctx, cr.host) },
	}}
	managed := subject{name: "background process start → first output, managed (warm)"}
	if cr.w == nil {
		managed.skip = "no worker"
	} else {
		managed.run = func() error { return d.firstOutput(ctx, cr.managed) }
	}
	return append(subjects, managed), d.stop, nil
}

// measureProcessStart measures the process subjects n times each: the
// bench's "background start → first output" rows.
func measureProcessStart(ctx context.Context, cr *corral, n int) ([]latRow, error) {
	subjects, stop, err := processSubjects(ctx, cr)
	if err != nil {
		return nil, err
	}
	defer stop()
	return measureLatency(subjects, n), nil
}

func init() {
	registerPhase(extraPhase{
		name:  "process",
		title: "Background processes",
		intro: "POST …/processes of `sh -c 'echo ready'` through the daemon's HTTP app, timed until its first output line arrives on GET …/output?follow=1 (a confined host project, and the warm managed project). Samples: a tenth of -n, at least 20.",
		run: func(ctx context.Context, env *phaseEnv) []latRow {
			n := max(env.cfg.n/10, 20)
			rows, err := measureProcessStart(ctx, env.cr, n)
			if err != nil {
				return []latRow{{name: "background process start → first output", failures: 1, firstErr: err}}
			}
			return rows
		},
	})
}
