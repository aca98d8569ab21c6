// Command corral runs bounded commands and long-lived sessions inside
// per-project Linux sandboxes.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	reexec()
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

// exitError carries an exit status out of a cobra command.
type exitError struct{ status int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.status) }

func execute(args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return 0
	}
	if ee, ok := err.(exitError); ok {
		return ee.status
	}
	fmt.Fprintf(stderr, "corral: %v\n", err)
	return 2
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "corral",
		Short:         "Run bounded commands inside per-project Linux sandboxes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newVersionCmd(), newImageCmd())
	addCommands(root)
	requireSubcommands(root)
	return root
}

// requireSubcommands makes every command that only groups subcommands
// refuse anything else: `corral token bogus` fails with exit status 2
// (cobra would print the help and exit 0); the bare group prints its help.
func requireSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		requireSubcommands(c)
	}
	if !cmd.HasSubCommands() || cmd.Runnable() || !cmd.HasParent() {
		return
	}
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unknown command %q for %q (see %s --help)", args[0], c.CommandPath(), c.CommandPath())
		}
		return nil
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print corral's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "corral %s (protocol 2)\n", version)
		},
	}
}
