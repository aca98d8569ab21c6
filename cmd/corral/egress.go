package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/store"
)

// newProjectEgressCmd is `corral project egress`: a project's network
// policy, set in the state's database (a running daemon applies it within
// a second).
func newProjectEgressCmd(state *stateFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "egress", Short: "Show or set a project's network policy"}
	var mode string
	var allow, deny []string
	set := &cobra.Command{
		Use:   "set PROJECT [--mode proxy] [--allow RULES] [--deny RULES]",
		Short: "Set a project's network policy (mode none, or proxy with allow and deny rules)",
		Long: `Set a project's network policy. Mode none (the default) leaves its machine
its loopback only. Mode proxy gives it HTTP(S) and SOCKS5 proxies that connect
where the rules allow: domains (pypi.org), wildcards (*.pythonhosted.org),
addresses and CIDRs, each with an optional :port; deny wins; the daemon's
floor (loopback, private, link-local, metadata addresses ...) holds whatever
the rules say. --allow or --deny alone imply --mode proxy.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if mode == "" {
				mode = string(egress.ModeNone)
				if len(allow)+len(deny) > 0 {
					mode = string(egress.ModeProxy)
				}
			}
			return withState(cmd, *state, func(ctx context.Context, _ string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				pol, err := egress.StorePolicy(ctx, st, p.ID, egress.Policy{Mode: egress.Mode(mode), Allow: allow, Deny: deny})
				if err != nil {
					return err
				}
				return printPolicy(cmd, p.Name, pol)
			})
		},
	}
	set.Flags().StringVar(&mode, "mode", "", "`MODE`: none or proxy")
	set.Flags().StringSliceVar(&allow, "allow", nil, "allow `RULES` (comma-separated, repeatable)")
	set.Flags().StringSliceVar(&deny, "deny", nil, "deny `RULES` (comma-separated, repeatable)")
	var asJSON bool
	show := &cobra.Command{
		Use:   "show PROJECT [--json]",
		Short: "Show a project's network policy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withState(cmd, *state, func(ctx context.Context, _ string, st store.Store) error {
				p, err := projectArg(ctx, st, args[0])
				if err != nil {
					return err
				}
				pol, err := egress.LoadPolicy(ctx, st, p.ID)
				if err != nil {
					return err
				}
				if asJSON {
					b, _ := json.Marshal(pol)
					_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
					return err
				}
				return printPolicy(cmd, p.Name, pol)
			})
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print the policy as JSON")
	cmd.AddCommand(set, show)
	return cmd
}

func printPolicy(cmd *cobra.Command, name string, p egress.Policy) error {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "project %s: mode %s\n", name, p.Mode)
	if len(p.Allow) > 0 {
		fmt.Fprintf(w, "allow: %s\n", strings.Join(p.Allow, ","))
	}
	if len(p.Deny) > 0 {
		fmt.Fprintf(w, "deny: %s\n", strings.Join(p.Deny, ","))
	}
	return nil
}

// oneOffEgress sets project's policy to mode proxy allowing rules for one
// `corral run --egress-allow`, and returns what restores the stored one.
func oneOffEgress(ctx context.Context, st store.Store, project int64, rules []string) (restore func(), err error) {
	prev, err := egress.LoadPolicy(ctx, st, project)
	if err != nil {
		return nil, err
	}
	if _, err := egress.StorePolicy(ctx, st, project, egress.Policy{Mode: egress.ModeProxy, Allow: rules}); err != nil {
		return nil, fmt.Errorf("--egress-allow: %w", err)
	}
	return func() {
		if _, err := egress.StorePolicy(context.Background(), st, project, prev); err != nil {
			fmt.Fprintf(os.Stderr, "corral: restoring the network policy of project %d: %v\n", project, err)
		}
	}, nil
}
