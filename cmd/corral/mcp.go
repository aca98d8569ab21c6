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

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/mcpserver"
)

func newMCPCmd() *cobra.Command {
	var f processFlags
	cmd := &cobra.Command{
		Use:   "mcp --daemon ADDR [--project-id N]",
		Short: "Serve the Model Context Protocol over stdio, as the token's account",
		Long: `mcp serves corral's tools to an agent over the Model Context Protocol on
standard input and output (the stdio transport: configure it as a command of
your MCP client). Every tool acts through the daemon at --daemon as the
account of --token (default $CORRAL_TOKEN): it can do what that token can do
over the API, nothing more. With --project-id, tools act on that project when
a call names none. Diagnostics go to standard error.

The daemon serves the same tools over streamable HTTP at /v1/mcp.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.daemon == "" {
				return errors.New("give --daemon ADDR")
			}
			if f.projectID < 0 {
				return fmt.Errorf("--project-id %d is not a project id", f.projectID)
			}
			c, err := f.dial()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serveMCP(ctx, c, f.projectID, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})))
		},
	}
	f.add(cmd)
	return cmd
}

// serveMCP checks that the daemon accepts the token, then serves the tools
// on stdio until the client closes its end or ctx ends.
func serveMCP(ctx context.Context, c *client.Client, projectID int64, log *slog.Logger) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := c.Whoami(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("the daemon does not accept this token: %w", err)
	}
	s := mcpserver.New(func(context.Context, *mcp.CallToolRequest) (mcpserver.API, error) { return c, nil },
		mcpserver.Options{ProjectID: projectID, Version: version, Logger: log})
	err = s.Run(ctx, &mcp.StdioTransport{})
	if ctx.Err() != nil {
		return nil
	}
	return err
}
