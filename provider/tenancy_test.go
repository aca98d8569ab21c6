package provider

import (
	"context"
	"errors"
	"testing"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// TestTenancyChangeAppliesToNextCommand: preparation reads the tenancy
// from a cache (store.CachedTenancy), yet a change made by another process
// applies to the very next command: trust withdrawn makes it confined, a
// membership revoked denies it, and no lease is minted for it.
func TestTenancyChangeAppliesToNextCommand(t *testing.T) {
	requireLandlock(t)
	ctx := context.Background()
	f := newFixture(t, fixtureOpts{trusted: true})
	other, err := store.Open(ctx, f.st.Path(), store.Options{}) // another process
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	a := f.actor
	mode := func() sandbox.LocalMode {
		t.Helper()
		prep, err := f.ctrl.PrepareExecution(ctx, f.input("", "true"), &a)
		if err != nil {
			t.Fatal(err)
		}
		lp := prep.(*LocalPrepared)
		if err := lp.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return lp.Mode
	}
	for range 2 { // the second preparation reads the cache
		if m := mode(); m != sandbox.LocalDirect {
			t.Fatalf("trusted member: mode %s", m)
		}
	}
	must(t, other.UpdateMember(ctx, store.Member{Project: f.project.ProjectID, Account: a.AccountUserID, Role: store.RoleOwner, Trusted: false}))
	if m := mode(); m != sandbox.LocalConfined {
		t.Fatalf("trust withdrawn: mode %s, want confined", m)
	}
	if _, err := f.run(t, "", "true"); err != nil {
		t.Fatal(err)
	}
	leases := len(f.leaseRows(t, ""))
	// Another owner, so that the actor can be removed.
	bob, err := other.CreateAccount(ctx, "bob")
	must(t, err)
	_, err = other.AddMember(ctx, store.Member{Project: f.project.ProjectID, Account: bob.ID, Role: store.RoleOwner})
	must(t, err)
	if _, err := f.run(t, "", "true"); err != nil { // the cache again
		t.Fatal(err)
	}
	leases++
	must(t, other.RemoveMember(ctx, f.project.ProjectID, a.AccountUserID))
	_, err = f.run(t, "", "true")
	if sandbox.KindOf(err) != sandbox.KindPrepare || !errors.Is(err, sandbox.ErrDenied) {
		t.Fatalf("after the revocation: %v, want a prepare error wrapping ErrDenied", err)
	}
	if n := len(f.leaseRows(t, "")); n != leases {
		t.Fatalf("%d leases, want %d: one was minted for the revoked member", n, leases)
	}
}
