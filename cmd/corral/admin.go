package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/store"
)

// The account, token and project subcommands work directly on the store
// (--store, default STATE/corral.db; migrating it if needed); the daemon may
// be running.

// stateFlags are the --state and --store flags of the administrative
// commands.
type stateFlags struct {
	dir   string // --state
	store string // --store
}

// openState opens the store of the flags.
func openState(ctx context.Context, flag stateFlags) (string, store.Store, error) {
	dir, err := stateDir(flag.dir)
	if err != nil {
		return "", nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return "", nil, err
	}
	if err := projects.PrepareStateDir(dir); err != nil {
		return "", nil, err
	}
	u, err := storeURL(flag.store, dir)
	if err != nil {
		return "", nil, err
	}
	st, err := store.Open(ctx, u, store.Options{Migrate: true})
	if err != nil {
		return "", nil, err
	}
	return dir, st, nil
}

// withState runs fn on the state's database, closing it afterwards.
func withState(cmd *cobra.Command, flag stateFlags, fn func(ctx context.Context, dir string, st store.Store) error) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	dir, st, err := openState(ctx, flag)
	if err != nil {
		return err
	}
	defer st.Close()
	return fn(ctx, dir, st)
}

func stateFlag(cmd *cobra.Command, p *stateFlags) {
	cmd.PersistentFlags().StringVar(&p.dir, "state", "", "state `DIR` (default $XDG_STATE_HOME/corral)")
	storeFlag(cmd.PersistentFlags(), &p.store)
}

func newAccountCmd() *cobra.Command {
	var state stateFlags
	var asJSON bool
	cmd := &cobra.Command{Use: "account", Short: "Manage accounts"}
	stateFlag(cmd, &state)
	cmd.AddCommand(&cobra.Command{
		Use:   "create NAME",
		Short: "Create an account and print its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				a, err := st.CreateAccount(ctx, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d\n", a.ID)
				return nil
			})
		},
	}, grantCmd(&state, true), grantCmd(&state, false), &cobra.Command{
		Use:   "list",
		Short: "List accounts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				as, err := st.ListAccounts(ctx)
				if err != nil {
					return err
				}
				return listing[store.Account]{
					items:  as,
					json:   func(a store.Account) any { return api.Account{ID: a.ID, Name: a.Name, Created: a.Created} },
					header: "ID\tNAME\tCREATED",
					row:    func(a store.Account) []any { return []any{a.ID, a.Name, when(a.Created)} },
				}.print(cmd, asJSON)
			})
		},
	}, &cobra.Command{
		Use:   "delete ACCOUNT",
		Short: "Delete an account with its tokens and memberships (its sessions close)",
		Long: `Delete ACCOUNT (name or id) with its tokens and memberships. Its live
sessions on a running daemon close within seconds. The only owner of a project
cannot be deleted: add another owner, or delete the project, first.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				a, err := accountArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				return st.DeleteAccount(ctx, a.ID)
			})
		},
	})
	for _, c := range cmd.Commands() {
		if c.Name() == "list" {
			jsonFlag(c, &asJSON)
		}
	}
	return cmd
}

// when formats a time for tables: "-" for the zero time.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// optTime is a time that is null in JSON when zero.
func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// grantCmd is `account grant` (on) or `account revoke` (off): the
// permissions an account has beyond its memberships.
func grantCmd(state *stateFlags, on bool) *cobra.Command {
	verb, short := "grant", "Grant an account a permission"
	if !on {
		verb, short = "revoke", "Revoke a permission of an account"
	}
	return &cobra.Command{
		Use:   verb + " host-paths ACCOUNT",
		Short: short,
		Long: short + `. The one permission so far is host-paths: creating host
projects and managed projects copied from a host directory or a local git
repository over HTTP, where the daemon runs with --allow-host-paths. "/", the
state directory and directories containing it stay refused.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "host-paths" {
				return fmt.Errorf("unknown permission %q (known: host-paths)", args[0])
			}
			return withState(cmd, *state, func(ctx context.Context, _ string, st store.Store) error {
				a, err := accountArg(ctx, st, args[1])
				if err != nil {
					return err
				}
				return st.SetHostPaths(ctx, a.ID, on)
			})
		},
	}
}

func newTokenCmd() *cobra.Command {
	var (
		state stateFlags
		name  string
	)
	var asJSON, createJSON bool
	cmd := &cobra.Command{Use: "token", Short: "Manage bearer tokens"}
	stateFlag(cmd, &state)
	create := &cobra.Command{
		Use:   "create ACCOUNT [--name N] [--json]",
		Short: "Mint a bearer token for ACCOUNT and print it (shown only once)",
		Long: `Mint a bearer token for ACCOUNT and print it on standard output (it is
shown only once), and its id — what token revoke takes — on standard error.
With --json, print {"id":N,"accountId":N,"name":S,"token":S} instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				a, err := accountArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				tok, t, err := st.CreateToken(ctx, a.ID, name)
				if err != nil {
					return err
				}
				if createJSON {
					return printJSON(cmd, api.Token{ID: t.ID, AccountID: a.ID, Name: t.Name, Token: tok})
				}
				fmt.Fprintln(cmd.OutOrStdout(), tok)
				fmt.Fprintf(cmd.ErrOrStderr(), "token id %d (revoke with: corral token revoke %d)\n", t.ID, t.ID)
				return nil
			})
		},
	}
	create.Flags().StringVar(&name, "name", "", "a `NAME` for the token")
	jsonFlag(create, &createJSON)
	revoke := &cobra.Command{
		Use:   "revoke TOKEN-ID",
		Short: "Revoke a token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return fmt.Errorf("token id %q is not a number", args[0])
			}
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				return st.RevokeToken(ctx, id)
			})
		},
	}
	list := &cobra.Command{
		Use:   "list [ACCOUNT] [--json]",
		Short: "List tokens (of ACCOUNT, or of every account): id, account, name, created, last used, revoked",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				var account int64
				if len(args) == 1 {
					a, err := accountArg(ctx, st, args[0])
					if err != nil {
						return err
					}
					account = a.ID
				}
				ts, err := st.ListTokens(ctx, account)
				if err != nil {
					return err
				}
				names := map[int64]string{}
				if as, err := st.ListAccounts(ctx); err == nil {
					for _, a := range as {
						names[a.ID] = a.Name
					}
				}
				return listing[store.Token]{
					items: ts,
					json: func(t store.Token) any {
						return tokenJSON{t.ID, t.Account, names[t.Account], t.Name, t.Created, optTime(t.LastUsed), optTime(t.Revoked)}
					},
					header: "ID\tACCOUNT\tNAME\tCREATED\tLAST USED\tREVOKED",
					row: func(t store.Token) []any {
						return []any{t.ID, names[t.Account], t.Name, when(t.Created), when(t.LastUsed), when(t.Revoked)}
					},
				}.print(cmd, asJSON)
			})
		},
	}
	jsonFlag(list, &asJSON)
	cmd.AddCommand(create, revoke, list)
	return cmd
}

// tokenJSON is a token in --json output (never the token itself).
type tokenJSON struct {
	ID          int64      `json:"id"`
	Account     int64      `json:"accountId"`
	AccountName string     `json:"account"`
	Name        string     `json:"name"`
	Created     time.Time  `json:"created"`
	LastUsed    *time.Time `json:"lastUsed"`
	Revoked     *time.Time `json:"revoked"`
}

// accountArg finds an account by name, or by id if the name is unknown
// and numeric.
func accountArg(ctx context.Context, st store.Store, s string) (store.Account, error) {
	a, err := st.AccountByName(ctx, s)
	if errors.Is(err, store.ErrNotFound) {
		if id, perr := strconv.ParseInt(s, 10, 64); perr == nil {
			return st.GetAccount(ctx, id)
		}
	}
	return a, err
}

// projectArg finds a project by name, or by id if the name is unknown and
// numeric.
func projectArg(ctx context.Context, st store.Store, s string) (store.Project, error) {
	p, err := st.ProjectByName(ctx, s)
	if errors.Is(err, store.ErrNotFound) {
		if id, perr := strconv.ParseInt(s, 10, 64); perr == nil {
			return st.GetProject(ctx, id)
		}
		if p, ok := projectAtPath(ctx, st, s); ok {
			return p, nil
		}
	}
	return p, err
}

// projectAtPath finds the project corral run registered for the directory
// s (a path, as given to --project or --host: "managed:/abs" or
// "host:/abs"), preferring the managed one.
func projectAtPath(ctx context.Context, st store.Store, s string) (store.Project, bool) {
	abs, err := filepath.Abs(s)
	if err != nil {
		return store.Project{}, false
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	for _, kind := range []store.ProjectKind{store.ProjectManaged, store.ProjectHost} {
		if p, err := st.ProjectByName(ctx, string(kind)+":"+abs); err == nil {
			return p, true
		}
	}
	return store.Project{}, false
}

func newProjectCmd() *cobra.Command {
	var state stateFlags
	cmd := &cobra.Command{Use: "project", Short: "Manage projects and their members"}
	stateFlag(cmd, &state)

	var (
		managed, network bool
		host, from, git  string
		owner            string
		exportRemotes    []string
	)
	create := &cobra.Command{
		Use:   "create NAME (--managed [--from DIR | --git URL] | --host DIR) --owner ACCOUNT",
		Short: "Create a project and print its id",
		Long: `Create a project owned by ACCOUNT and print its id.

--managed makes a workspace STATE/projects/NAME for a managed machine: empty,
a copy of the host directory --from DIR, or a clone of --git URL (cloned on the
host). --host DIR makes a host project rooted at the existing directory DIR;
its members' commands are confined (as its own unprivileged user when corral
is root) and have no network unless --network, except trusted members'
(add-member --trusted), which run unconfined as corral's own user.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if managed == (host != "") {
				return errors.New("give exactly one of --managed and --host DIR")
			}
			if host != "" && (from != "" || git != "") {
				return errors.New("--from and --git go with --managed")
			}
			if network && host == "" {
				return errors.New("--network goes with --host")
			}
			if owner == "" {
				return errors.New("--owner ACCOUNT is required")
			}
			return withState(cmd, state, func(ctx context.Context, dir string, st store.Store) error {
				a, err := accountArg(ctx, st, owner)
				if err != nil {
					return fmt.Errorf("owner: %w", err)
				}
				spec := projects.ProjectSpec{Name: args[0], Kind: store.ProjectManaged, From: absOrEmpty(from), Git: git, Owner: a.ID}
				if host != "" {
					spec = projects.ProjectSpec{Name: args[0], Kind: store.ProjectHost, Root: absOrEmpty(host), Owner: a.ID}
				}
				for _, p := range exportRemotes {
					if err := export.ValidRemotePattern(p); err != nil {
						return err
					}
				}
				spec.ExportRemotes = exportRemotes
				spec.Progress = func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), line) }
				p, err := (&projects.Projects{Store: st, StateDir: dir}).Create(ctx, spec)
				if err != nil {
					return err
				}
				if network {
					if err := st.SetProjectNetwork(ctx, p.ID, true); err != nil {
						return err
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d\n", p.ID)
				return nil
			})
		},
	}
	cf := create.Flags()
	cf.BoolVar(&managed, "managed", false, "a managed project (its own machine)")
	cf.StringVar(&host, "host", "", "a host project rooted at `DIR`")
	cf.StringVar(&from, "from", "", "copy the workspace from the host `DIR` (--managed)")
	cf.StringVar(&git, "git", "", "clone the workspace from `URL` (--managed)")
	cf.StringVar(&owner, "owner", "", "the owning `ACCOUNT` (name or id)")
	cf.StringArrayVar(&exportRemotes, "export-remote", nil, "export only to remotes matching `PATTERN` too (narrows the daemon's --export-remote; repeatable)")
	cf.BoolVar(&network, "network", false, "let confined commands use the host's network (--host)")

	networkCmd := &cobra.Command{
		Use:   "network PROJECT on|off",
		Short: "Let a host project's confined commands use the host's network, or not",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var on bool
			switch args[1] {
			case "on":
				on = true
			case "off":
			default:
				return fmt.Errorf("network %q: want on or off", args[1])
			}
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				if p.Kind != store.ProjectHost {
					return fmt.Errorf("project %s is a %s project: network applies to host projects", p.Name, p.Kind)
				}
				return st.SetProjectNetwork(ctx, p.ID, on)
			})
		},
	}

	var trusted, asOwner bool
	addMember := &cobra.Command{
		Use:   "add-member PROJECT ACCOUNT [--trusted] [--owner]",
		Short: "Add ACCOUNT to PROJECT (names or ids)",
		Long: `Add ACCOUNT to PROJECT. --trusted lets it run host commands without
confinement; --owner makes it an owner (owners manage members over HTTP).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				a, err := accountArg(ctx, st, args[1])
				if err != nil {
					return err
				}
				role := store.RoleMember
				if asOwner {
					role = store.RoleOwner
				}
				if _, err = st.AddMember(ctx, store.Member{Project: p.ID, Account: a.ID, Role: role, Trusted: trusted}); err != nil {
					return err
				}
				if trusted && p.Kind == store.ProjectHost {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: %s is trusted: its commands in %s run unconfined, as corral's own user (root for a root daemon)\n", a.Name, p.Name)
				}
				return nil
			})
		},
	}
	addMember.Flags().BoolVar(&trusted, "trusted", false, "run host commands unconfined")
	addMember.Flags().BoolVar(&asOwner, "owner", false, "make the account an owner")

	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "List projects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				ps, err := st.ListProjects(ctx)
				if err != nil {
					return err
				}
				l := listing[store.Project]{
					items: ps,
					json: func(p store.Project) any {
						return projectJSON{p.ID, p.Name, string(p.Kind), p.Root, p.Created, projectImage(p)}
					},
					header: "ID\tNAME\tKIND\tROOT\tIMAGE\tNETWORK\tTRUSTED (unconfined, as corral's user)",
				}
				if asJSON {
					return l.print(cmd, true)
				}
				accounts, err := st.ListAccounts(ctx)
				if err != nil {
					return err
				}
				names := map[int64]string{}
				for _, a := range accounts {
					names[a.ID] = a.Name
				}
				rows := map[int64][]any{}
				for _, p := range ps {
					network, trusted := "-", "-"
					if p.Kind == store.ProjectHost {
						network = "no"
						if p.Network {
							network = "yes"
						}
						ms, err := st.ListMembers(ctx, p.ID)
						if err != nil {
							return err
						}
						var ts []string
						for _, m := range ms {
							if m.Trusted {
								ts = append(ts, names[m.Account])
							}
						}
						if len(ts) > 0 {
							trusted = strings.Join(ts, ",")
						}
					}
					img := projectImage(p)
					if img == "" {
						img = "-"
					}
					rows[p.ID] = []any{p.ID, p.Name, p.Kind, p.Root, img, network, trusted}
				}
				l.row = func(p store.Project) []any { return rows[p.ID] }
				return l.print(cmd, false)
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete PROJECT",
		Short: "Delete a project (refused while it has live leases)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, dir string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				err = (&projects.Projects{Store: st, StateDir: dir}).Delete(ctx, p.ID)
				if errors.Is(err, store.ErrProjectBusy) {
					return fmt.Errorf("project %s is in use (live leases); try again when its commands ended: %w", p.Name, err)
				}
				return err
			})
		},
	}
	jsonFlag(list, &asJSON)
	members := &cobra.Command{
		Use:   "members PROJECT [--json]",
		Short: "List PROJECT's members: account, role, trusted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				ms, err := st.ListMembers(ctx, p.ID)
				if err != nil {
					return err
				}
				out := make([]api.Member, 0, len(ms))
				for _, m := range ms {
					mj := api.Member{AccountID: m.Account, Role: string(m.Role), Trusted: m.Trusted, Created: m.Created}
					if a, err := st.GetAccount(ctx, m.Account); err == nil {
						mj.Account = a.Name
					}
					out = append(out, mj)
				}
				return listing[api.Member]{
					items:  out,
					header: "ACCOUNT\tID\tROLE\tTRUSTED\tSINCE",
					row: func(m api.Member) []any {
						return []any{m.Account, m.AccountID, m.Role, m.Trusted, when(m.Created)}
					},
				}.print(cmd, asJSON)
			})
		},
	}
	jsonFlag(members, &asJSON)
	removeMember := &cobra.Command{
		Use:   "remove-member PROJECT ACCOUNT",
		Short: "Remove ACCOUNT from PROJECT (its sessions in the project close)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				a, err := accountArg(ctx, st, args[1])
				if err != nil {
					return err
				}
				if err := st.RemoveMember(ctx, p.ID, a.ID); err != nil {
					if errors.Is(err, store.ErrNotFound) {
						return fmt.Errorf("account %q is not a member of project %q", a.Name, p.Name)
					}
					return err
				}
				return nil
			})
		},
	}
	cmd.AddCommand(create, addMember, list, del, networkCmd, newSetMachineCmd(&state), newResetCmd(&state), newProjectEgressCmd(&state), members, removeMember)
	return cmd
}

// projectJSON is a project in --json output.
type projectJSON struct {
	ID      int64     `json:"id"`
	Name    string    `json:"name"`
	Kind    string    `json:"kind"`
	Root    string    `json:"root"`
	Created time.Time `json:"created"`
	// Image is a managed project's machine image (empty for host
	// projects).
	Image string `json:"image,omitempty"`
}

func absOrEmpty(p string) string {
	if p == "" {
		return ""
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// projectImage is a managed project's image name ("" for a host project).
func projectImage(p store.Project) string {
	switch {
	case p.Kind != store.ProjectManaged:
		return ""
	case p.Image == "":
		return store.DefaultImage
	}
	return p.Image
}
