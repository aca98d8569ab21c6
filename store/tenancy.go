package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// Tenancy is a project and an account's membership of it, as one read saw
// them, with the project's egress policy and its tenancy version as of that
// read (schema 16): every change to the project, to one of its memberships
// or to its egress policy, by any process, bumps the project's version.
// Other projects' changes do not.
type Tenancy struct {
	Project Project
	Member  Member
	// Version is the project's tenancy version the rows were read at. A
	// lease created with it (NewLease.TenancyVersion) is refused with
	// ErrTenancyChanged if the project or any of its memberships changed
	// since.
	Version int64
	// EgressPolicy is the project's stored egress policy as of the same
	// read (what Store.EgressPolicy returns: JSON, "" for none). A policy
	// change bumps the project's version too (schema 17), so a lease
	// created under Version confirms the policy was still this one.
	EgressPolicy string
}

// ErrTenancyChanged: CreateLease was given a NewLease.TenancyVersion and the
// project, one of its memberships or its egress policy changed since that
// version was read
// (or the project was deleted); no lease was
// created. Read the tenancy again (CachedTenancy does, once this error was
// returned) and retry.
var ErrTenancyChanged = errors.New("store: the tenancy changed since it was read")

// maxTenancyCache bounds CachedTenancy's entries; when full it starts over.
const maxTenancyCache = 4096

// tenancyCache holds the successful reads of CachedTenancy, for either
// backend. Its zero value is empty and ready.
type tenancyCache struct {
	mu      sync.Mutex
	m       map[[2]int64]Tenancy // by project, account
	refused atomic.Int64         // leases refused with ErrTenancyChanged
}

// get is CachedTenancy over read, the backend's tenancy read.
func (c *tenancyCache) get(ctx context.Context, project, account int64, read func(ctx context.Context, project, account int64) (Tenancy, error)) (Tenancy, error) {
	k := [2]int64{project, account}
	c.mu.Lock()
	t, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := read(ctx, project, account)
	if err != nil {
		return t, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxTenancyCache {
		c.m = make(map[[2]int64]Tenancy)
	}
	if old, ok := c.m[k]; !ok || old.Version < t.Version {
		c.m[k] = t
	}
	c.mu.Unlock()
	return t, nil
}

// forget drops the cached entry of project and account if it was read at
// version, after a lease under that version was refused (which it counts).
func (c *tenancyCache) forget(project, account, version int64) {
	c.refused.Add(1)
	k := [2]int64{project, account}
	c.mu.Lock()
	if t, ok := c.m[k]; ok && t.Version == version {
		delete(c.m, k)
	}
	c.mu.Unlock()
}

func (s *sqliteStore) CachedTenancy(ctx context.Context, project, account int64) (Tenancy, error) {
	return s.tenancy.get(ctx, project, account, s.readTenancy)
}
