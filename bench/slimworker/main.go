// Command slimworker is the privileged worker linked alone: the bench's
// experiment on how much of a managed command's cost comes from re-executing
// a large binary (corral's, with its store, HTTP and metrics packages) as
// every machine's init and every session's pid namespace holder.
//
//	slimworker SOCKET PROJECTS_ROOT STATE_DIR
//
// It serves until SIGTERM.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker"
)

func main() {
	worker.MaybeRunInit()
	if err := serve(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "slimworker: %v\n", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	if len(args) != 3 {
		return errors.New("usage: slimworker SOCKET PROJECTS_ROOT STATE_DIR")
	}
	w, err := worker.New(worker.Config{
		ProjectsRoot: args[1],
		StateDir:     args[2],
		CgroupParent: fmt.Sprintf("corral-bench-slim-%d", os.Getpid()),
		// Ranges of its own (the bench's main worker runs beside it) come
		// from the registry claim of its state directory.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Name:   "corral-bench-slimworker",
	})
	if err != nil {
		return err
	}
	ln, err := wire.Listen(args[0])
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	serveErr := w.Serve(ctx, ln)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(serveErr, w.Shutdown(sctx))
}
