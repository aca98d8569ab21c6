package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/store"
)

// The account, token and project subcommands work directly on
// STATE/corral.db (migrating it if needed); the daemon may be running.

// openState opens the state directory's database.
func openState(ctx context.Context, flag string) (string, *store.Store, error) {
	dir, err := stateDir(flag)
	if err != nil {
		return "", nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return "", nil, err
	}
	if err := daemon.PrepareStateDir(dir); err != nil {
		return "", nil, err
	}
	st, err := store.Open(ctx, filepath.Join(dir, "corral.db"), store.Options{Migrate: true})
	if err != nil {
		return "", nil, err
	}
	return dir, st, nil
}

// withState runs fn on the state's database, closing it afterwards.
func withState(cmd *cobra.Command, flag string, fn func(ctx context.Context, dir string, st *store.Store) error) error {
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

func stateFlag(cmd *cobra.Command, p *string) {
	cmd.PersistentFlags().StringVar(p, "state", "", "state `DIR` (default $XDG_STATE_HOME/corral)")
}

func newAccountCmd() *cobra.Command {
	var state string
	cmd := &cobra.Command{Use: "account", Short: "Manage accounts"}
	stateFlag(cmd, &state)
	cmd.AddCommand(&cobra.Command{
		Use:   "create NAME",
		Short: "Create an account and print its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st *store.Store) error {
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
			return withState(cmd, state, func(ctx context.Context, _ string, st *store.Store) error {
				as, err := st.ListAccounts(ctx)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME")
				for _, a := range as {
					fmt.Fprintf(tw, "%d\t%s\n", a.ID, a.Name)
				}
				return tw.Flush()
			})
		},
	})
	return cmd
}

// grantCmd is `account grant` (on) or `account revoke` (off): the
// permissions an account has beyond its memberships.
func grantCmd(state *string, on bool) *cobra.Command {
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
			return withState(cmd, *state, func(ctx context.Context, _ string, st *store.Store) error {
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
	var state, name string
	cmd := &cobra.Command{Use: "token", Short: "Manage bearer tokens"}
	stateFlag(cmd, &state)
	create := &cobra.Command{
		Use:   "create ACCOUNT [--name N]",
		Short: "Mint a bearer token for ACCOUNT and print it (shown only once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st *store.Store) error {
				a, err := accountArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				tok, _, err := st.CreateToken(ctx, a.ID, name)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), tok)
				return nil
			})
		},
	}
	create.Flags().StringVar(&name, "name", "", "a `NAME` for the token")
	revoke := &cobra.Command{
		Use:   "revoke TOKEN-ID",
		Short: "Revoke a token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return fmt.Errorf("token id %q is not a number", args[0])
			}
			return withState(cmd, state, func(ctx context.Context, _ string, st *store.Store) error {
				return st.RevokeToken(ctx, id)
			})
		},
	}
	cmd.AddCommand(create, revoke)
	return cmd
}

// accountArg finds an account by name, or by id if the name is unknown
// and numeric.
func accountArg(ctx context.Context, st *store.Store, s string) (store.Account, error) {
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
func projectArg(ctx context.Context, st *store.Store, s string) (store.Project, error) {
	p, err := st.ProjectByName(ctx, s)
	if errors.Is(err, store.ErrNotFound) {
		if id, perr := strconv.ParseInt(s, 10, 64); perr == nil {
			return st.GetProject(ctx, id)
		}
	}
	return p, err
}

func newProjectCmd() *cobra.Command {
	var state string
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
			return withState(cmd, state, func(ctx context.Context, dir string, st *store.Store) error {
				a, err := accountArg(ctx, st, owner)
				if err != nil {
					return fmt.Errorf("owner: %w", err)
				}
				spec := daemon.ProjectSpec{Name: args[0], Kind: store.ProjectManaged, From: absOrEmpty(from), Git: git, Owner: a.ID}
				if host != "" {
					spec = daemon.ProjectSpec{Name: args[0], Kind: store.ProjectHost, Root: absOrEmpty(host), Owner: a.ID}
				}
				for _, p := range exportRemotes {
					if err := export.ValidRemotePattern(p); err != nil {
						return err
					}
				}
				spec.ExportRemotes = exportRemotes
				spec.Progress = func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), line) }
				p, err := (&daemon.Projects{Store: st, StateDir: dir}).Create(ctx, spec)
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
			return withState(cmd, state, func(ctx context.Context, _ string, st *store.Store) error {
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
			return withState(cmd, state, func(ctx context.Context, _ string, st *store.Store) error {
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

	list := &cobra.Command{
		Use:   "list",
		Short: "List projects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withState(cmd, state, func(ctx context.Context, _ string, st *store.Store) error {
				ps, err := st.ListProjects(ctx)
				if err != nil {
					return err
				}
				accounts, err := st.ListAccounts(ctx)
				if err != nil {
					return err
				}
				names := map[int64]string{}
				for _, a := range accounts {
					names[a.ID] = a.Name
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tNAME\tKIND\tROOT\tNETWORK\tTRUSTED (unconfined, as corral's user)")
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
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", p.ID, p.Name, p.Kind, p.Root, network, trusted)
				}
				return tw.Flush()
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete PROJECT",
		Short: "Delete a project (refused while it has live leases)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, state, func(ctx context.Context, dir string, st *store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				err = (&daemon.Projects{Store: st, StateDir: dir}).Delete(ctx, p.ID)
				if errors.Is(err, store.ErrProjectBusy) {
					return fmt.Errorf("project %s is in use (live leases); try again when its commands ended: %w", p.Name, err)
				}
				return err
			})
		},
	}
	cmd.AddCommand(create, addMember, list, del, networkCmd, newSetMachineCmd(&state), newResetCmd(&state))
	return cmd
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
