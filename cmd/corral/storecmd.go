package main

import (
	"context"
	"fmt"

	"github.com/corral-sandbox/corral/store"
	"github.com/spf13/cobra"
)

// newStoreCmd is `corral store`: operations on a store as a whole.
func newStoreCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Operate on a whole store (moving an installation to PostgreSQL)",
	}
	var from, to string
	cp := &cobra.Command{
		Use:   "copy --from sqlite:PATH --to postgres://...",
		Short: "Copy an installation from SQLite to an empty PostgreSQL database",
		Long: `Copy every row of the installation in the SQLite store --from (accounts and
their token hashes, projects and members, egress policies, Sites
publications, leases, the command journal, artifacts and the egress journal)
into the PostgreSQL store --to, keeping every ID; tokens keep working.

--to is migrated to this corral's schema first, and must be empty: a store
with rows is refused and nothing is written. --from must be at this corral's
schema version (run this corral's daemon on it once if it is older). --from
is read in one transaction, so a daemon may keep running on it; what it
writes after the copy started is not copied: stop it first for a move.

Prints the rows copied per table.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if from == "" || to == "" {
				return fmt.Errorf("--from and --to are both required")
			}
			for _, u := range []struct{ flag, url, want string }{{"--from", from, store.SchemeSQLite}, {"--to", to, store.SchemePostgres}} {
				scheme, _, err := store.SplitURL(u.url)
				if err != nil {
					return fmt.Errorf("%s: %w", u.flag, err)
				}
				if scheme != u.want {
					return fmt.Errorf("%s %s: want a %s store", u.flag, store.Redact(u.url), u.want)
				}
			}
			src, err := store.Open(ctx, from, store.Options{})
			if err != nil {
				return fmt.Errorf("--from: %w", err)
			}
			defer src.Close()
			dst, err := store.Open(ctx, to, store.Options{Migrate: true})
			if err != nil {
				return fmt.Errorf("--to: %w", err)
			}
			defer dst.Close()
			counts, err := store.Copy(ctx, dst, src)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, c := range counts {
				fmt.Fprintf(w, "%-18s %d\n", c.Table, c.Rows)
			}
			return nil
		},
	}
	cp.Flags().StringVar(&from, "from", "", "the SQLite store `URL` to copy (sqlite:PATH)")
	cp.Flags().StringVar(&to, "to", "", "the empty PostgreSQL store `URL` to copy into (postgres://...; the password from PGPASSWORD or a passfile)")
	cmd.AddCommand(cp)
	return cmd
}
