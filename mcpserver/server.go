// Package mcpserver is corral's Model Context Protocol server: the tools an
// agent uses to run commands, drive background processes and read and
// write files in corral's projects, defined once over API (what the Go
// client of the daemon does) and served on two faces:
//
//   - `corral mcp` serves New over stdio, with a *client.Client of the
//     daemon holding the user's token;
//   - the daemon serves NewHandler at /v1/mcp over streamable HTTP: each
//     tool call acts as the account of the bearer token of the HTTP
//     request that carried it, through the daemon's own API handler in
//     the same process, so that it passes the same authentication,
//     membership checks and bounds as any other call of that account.
//
// Every tool acts only through API: a tool can do exactly what its token
// may do over HTTP, never more. A tenant's mistake (bad input, a project
// it may not reach, a command that timed out) is a tool error (a result
// with IsError set and a message saying what to change), never a protocol
// error. Output larger than a result should carry is cut with a marker
// that says how to read the rest (by offset); the limits are the constants
// below, and each tool's description quotes them.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/sandbox"
)

// API is what the tools need of corral's daemon: *client.Client has it.
// Each method has the semantics and errors of the client's method of the
// same name.
type API interface {
	Projects(ctx context.Context) ([]client.Project, error)
	CreateProject(ctx context.Context, req client.ProjectRequest) (*client.Project, error)

	RunCommand(ctx context.Context, projectID int64, req client.CommandRequest) (*sandbox.CommandResult, error)

	StartProcess(ctx context.Context, projectID int64, req client.ProcessRequest) (*client.Process, error)
	Processes(ctx context.Context, projectID int64) ([]client.Process, error)
	Process(ctx context.Context, projectID int64, id string) (*client.Process, error)
	ProcessOutput(ctx context.Context, projectID int64, id string, opts client.OutputOptions, fn func(client.OutputChunk) error) (*client.OutputEnd, error)
	SignalProcess(ctx context.Context, projectID int64, id, signal string) (*client.Process, error)
	KillProcess(ctx context.Context, projectID int64, id string) (*client.Process, error)

	ReadFile(ctx context.Context, projectID int64, path, user string) (io.ReadCloser, client.FileInfo, error)
	WriteFile(ctx context.Context, projectID int64, path, user string, mode uint32, r io.Reader) (client.FileInfo, error)
	StatFile(ctx context.Context, projectID int64, path, user string) (client.FileInfo, error)
	ListFiles(ctx context.Context, projectID int64, path, user string, depth, limit int) (*client.FileList, error)
	Mkdir(ctx context.Context, projectID int64, path, user string, mode uint32, parents bool) (client.FileInfo, error)
}

var _ API = (*client.Client)(nil)

// Resolver returns the API a tool call acts through: the account it acts
// as. An error ends the call with a tool error carrying its message.
type Resolver func(ctx context.Context, req *mcp.CallToolRequest) (API, error)

// Options configure New. The zero value serves every tool with no default
// project.
type Options struct {
	// ProjectID is the project a tool call acts on when it names none
	// (`corral mcp --project-id`). Zero: every project tool must be given
	// project_id.
	ProjectID int64
	// Version is the server's version in the MCP handshake; empty is
	// "dev".
	Version string
	// Logger receives the SDK's diagnostics; nil discards them.
	Logger *slog.Logger
}

// Name is the server's name in the MCP handshake.
const Name = "corral"

// New returns an MCP server with corral's tools, each acting through the
// API that api returns for the call.
func New(api Resolver, opts Options) *mcp.Server {
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: Name, Version: version}, &mcp.ServerOptions{
		Logger:       log,
		Instructions: instructions,
	})
	t := &tools{api: api, defaultProject: opts.ProjectID}
	t.addProjectTools(s)
	t.addCommandTools(s)
	t.addProcessTools(s)
	t.addFileTools(s)
	// Snapshots and forks of projects have no API yet: their tools
	// (snapshot_project, fork_project) belong here, in a file of their
	// own, once the daemon has them.
	return s
}

const instructions = `corral runs commands in per-project Linux sandboxes ("machines"). Pick a project with list_projects or create one with create_project, then pass its id as project_id (unless the server has a default project). run_command runs a bounded command and returns its exit code and output; start_process starts a long-running one whose output you read by offset with read_process_output. Files are read and written with read_file, write_file, list_files and stat_file; relative paths are relative to the project's workspace (/workspace).`

// tools holds what every tool handler needs.
type tools struct {
	api            Resolver
	defaultProject int64
}

// failer is an output that says its call failed (IsError) while carrying
// a result worth reading: a command that timed out, with its partial
// output.
type failer interface{ failed() bool }

// add registers a tool whose handler gets the call's API; in's schema is
// inferred from In (its jsonschema tags describe the fields) and the
// SDK checks the arguments against it before fn runs. An error of fn is
// the call's tool error.
func add[In, Out any](s *mcp.Server, t *tools, name, description string, fn func(ctx context.Context, api API, in In) (Out, error)) {
	mcp.AddTool(s, &mcp.Tool{Name: name, Description: description}, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		ctx, stop := withRequest(ctx)
		defer stop()
		api, err := t.api(ctx, req)
		if err != nil {
			return nil, zero, err
		}
		out, err := fn(ctx, api, in)
		if err != nil {
			return nil, zero, err
		}
		if f, ok := any(out).(failer); ok && f.failed() {
			return &mcp.CallToolResult{IsError: true}, out, nil
		}
		return nil, out, nil
	})
}

// ProjectArg names the project a tool acts on; tools embed it.
type ProjectArg struct {
	ProjectID int64 `json:"project_id,omitempty" jsonschema:"the project's id (from list_projects or create_project); may be left out when the server has a default project"`
}

// project returns the project a call acts on.
func (t *tools) project(a ProjectArg) (int64, error) {
	switch {
	case a.ProjectID > 0:
		return a.ProjectID, nil
	case a.ProjectID < 0:
		return 0, fmt.Errorf("project_id %d is not a project id (ids are positive)", a.ProjectID)
	case t.defaultProject > 0:
		return t.defaultProject, nil
	}
	return 0, errors.New("project_id is required: this server has no default project (list_projects shows yours, create_project makes one)")
}

// projectAnd returns the project of a call that must also be given the
// argument name (value is its value; hint follows the error).
func (t *tools) projectAnd(a ProjectArg, name, value, hint string) (int64, error) {
	id, err := t.project(a)
	if err == nil && value == "" {
		err = fmt.Errorf("%s is required%s", name, hint)
	}
	return id, err
}
