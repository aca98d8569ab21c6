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
	return root
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
