package mcpserver

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-sandbox/corral/client"
)

// ProjectList is list_projects' result.
type ProjectList struct {
	Projects []client.Project `json:"projects"`
}

// CreateProjectArgs are create_project's arguments.
type CreateProjectArgs struct {
	Name string `json:"name" jsonschema:"the new project's name"`
	Git  string `json:"git,omitempty" jsonschema:"a git URL to clone into the new project's workspace (default: an empty workspace)"`
}

func (t *tools) addProjectTools(s *mcp.Server) {
	add(s, t, "list_projects", "List the projects this token may use: their ids (the project_id of the other tools), names and your role.",
		func(ctx context.Context, api API, _ struct{}) (ProjectList, error) {
			ps, err := api.Projects(ctx)
			if ps == nil {
				ps = []client.Project{}
			}
			return ProjectList{Projects: ps}, err
		})
	add(s, t, "create_project", "Create a project with a machine of its own (a managed project), owned by this token's account, and return it: pass its id as project_id to the other tools. The daemon bounds how many projects an account may have.",
		func(ctx context.Context, api API, in CreateProjectArgs) (*client.Project, error) {
			if in.Name == "" {
				return nil, errors.New("name is required")
			}
			return api.CreateProject(ctx, client.ProjectRequest{Name: in.Name, Kind: "managed", Git: in.Git})
		})
}
