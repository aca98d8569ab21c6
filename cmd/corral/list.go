package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// The output of the list commands: a table for people, or with --json the
// list as a JSON array.

// jsonFlag adds --json to cmd, setting *p.
func jsonFlag(cmd *cobra.Command, p *bool) {
	cmd.Flags().BoolVar(p, "json", false, "print JSON")
}

// printJSON prints v as indented JSON.
func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// listing is one list command's answer: its items, and how each shows.
type listing[T any] struct {
	items []T
	// json returns an item's JSON value; nil means the item itself.
	json func(T) any
	// header names the table's columns, separated by tabs.
	header string
	// row returns an item's cells, printed with fmt.Print's formats.
	row func(T) []any
}

// print prints l: with asJSON the JSON array of its items' values ([]
// for none), otherwise a table, its columns aligned.
func (l listing[T]) print(cmd *cobra.Command, asJSON bool) error {
	if asJSON {
		out := make([]any, 0, len(l.items))
		for _, it := range l.items {
			if l.json != nil {
				out = append(out, l.json(it))
			} else {
				out = append(out, it)
			}
		}
		return printJSON(cmd, out)
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, l.header)
	for _, it := range l.items {
		for i, c := range l.row(it) {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
