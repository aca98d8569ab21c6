package main

import (
	"fmt"

	"github.com/corral-sandbox/corral/store"
	"github.com/spf13/pflag"
)

// The --store flag of every command that opens the store: its one
// spelling, help and parsing. The daemon's configuration (daemon.Config's
// Store) takes what storeURL returns.

// storeFlagHelp is the --store flag's help.
const storeFlagHelp = "the store `URL`: sqlite:PATH or postgres://... (libpq-style; the password from PGPASSWORD or a passfile, never logged; default sqlite:STATE/corral.db)"

// storeFlag registers --store on fl, into p.
func storeFlag(fl *pflag.FlagSet, p *string) {
	fl.StringVar(p, "store", "", storeFlagHelp)
}

// storeURL returns the store URL of the --store flag's value: the flag if
// set (checked: an unknown scheme or an empty path is an error naming the
// URL redacted), else the state directory's SQLite file.
func storeURL(flag, stateDir string) (string, error) {
	if flag == "" {
		return store.DefaultURL(stateDir), nil
	}
	if _, _, err := store.SplitURL(flag); err != nil {
		return "", fmt.Errorf("--store: %w", err)
	}
	return flag, nil
}
