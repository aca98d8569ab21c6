package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAdminCLIForPeople: errors in words, token ids shown and listed, JSON
// lists, members managed, accounts deleted, unknown subcommands refused.
func TestAdminCLIForPeople(t *testing.T) {
	state := t.TempDir()
	mustCLI(t, "account", "create", "bob", "--state", state)
	mustCLI(t, "account", "create", "carol", "--state", state)
	_, errs, status := cli("account", "create", "bob", "--state", state)
	if status != 2 || errs != "corral: account \"bob\" already exists\n" {
		t.Errorf("duplicate account: %d %q", status, errs)
	}

	tok, errs, status := cli("token", "create", "bob", "--name", "laptop", "--state", state)
	if status != 0 || !strings.HasPrefix(tok, "corral_") || !strings.Contains(errs, "token id 1 (revoke with: corral token revoke 1)") {
		t.Fatalf("token create: %d %q %q", status, tok, errs)
	}
	var created struct {
		ID    int64  `json:"id"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(mustCLI(t, "token", "create", "carol", "--json", "--state", state)), &created); err != nil || created.ID != 2 || !strings.HasPrefix(created.Token, "corral_") {
		t.Fatalf("token create --json: %+v %v", created, err)
	}
	mustCLI(t, "token", "revoke", "2", "--state", state)
	table := mustCLI(t, "token", "list", "--state", state)
	if !strings.Contains(table, "LAST USED") || !strings.Contains(table, "laptop") || strings.Contains(table, "corral_") {
		t.Errorf("token list:\n%s", table)
	}
	var toks []struct {
		ID      int64   `json:"id"`
		Account string  `json:"account"`
		Revoked *string `json:"revoked"`
	}
	if err := json.Unmarshal([]byte(mustCLI(t, "token", "list", "--json", "--state", state)), &toks); err != nil || len(toks) != 2 || toks[0].Account != "bob" || toks[0].Revoked != nil || toks[1].Revoked == nil {
		t.Fatalf("token list --json: %+v %v", toks, err)
	}
	if err := json.Unmarshal([]byte(mustCLI(t, "token", "list", "carol", "--json", "--state", state)), &toks); err != nil || len(toks) != 1 || toks[0].ID != 2 {
		t.Fatalf("token list carol: %+v %v", toks, err)
	}

	mustCLI(t, "project", "create", "web", "--host", t.TempDir(), "--owner", "bob", "--state", state)
	mustCLI(t, "project", "add-member", "web", "carol", "--state", state)
	var ms []struct {
		Account string `json:"account"`
		Role    string `json:"role"`
	}
	if err := json.Unmarshal([]byte(mustCLI(t, "project", "members", "web", "--json", "--state", state)), &ms); err != nil || len(ms) != 2 {
		t.Fatalf("project members --json: %+v %v", ms, err)
	}
	if out := mustCLI(t, "project", "members", "web", "--state", state); !strings.Contains(out, "carol") || !strings.Contains(out, "owner") {
		t.Errorf("project members:\n%s", out)
	}
	mustCLI(t, "project", "remove-member", "web", "carol", "--state", state)
	if _, errs, status := cli("project", "remove-member", "web", "carol", "--state", state); status != 2 || !strings.Contains(errs, `account "carol" is not a member of project "web"`) {
		t.Errorf("remove a non-member: %d %q", status, errs)
	}
	var ps []struct{ Name string }
	if err := json.Unmarshal([]byte(mustCLI(t, "project", "list", "--json", "--state", state)), &ps); err != nil || len(ps) != 1 || ps[0].Name != "web" {
		t.Fatalf("project list --json: %+v %v", ps, err)
	}

	if _, errs, status := cli("account", "delete", "bob", "--state", state); status != 2 || !strings.Contains(errs, `only owner of project "web"`) {
		t.Errorf("delete the only owner: %d %q", status, errs)
	}
	mustCLI(t, "account", "delete", "carol", "--state", state)
	var as []struct{ Name string }
	if err := json.Unmarshal([]byte(mustCLI(t, "account", "list", "--json", "--state", state)), &as); err != nil || len(as) != 1 || as[0].Name != "bob" {
		t.Fatalf("account list --json after delete: %+v %v", as, err)
	}

	for _, args := range [][]string{{"token", "bogus"}, {"account", "frobnicate"}, {"project", "nope", "x"}, {"bogus"}} {
		if _, errs, status := cli(append(args, "--state", state)...); status != 2 || !strings.Contains(errs, "unknown command") {
			t.Errorf("corral %v: %d %q", args, status, errs)
		}
	}
	if _, _, status := cli("token", "--state", state); status != 0 {
		t.Errorf("bare group: %d", status)
	}
}
