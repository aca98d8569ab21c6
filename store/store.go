// Package store is corral's database: accounts and their bearer tokens,
// projects and their members, provider-side leases, the command journal,
// egress policies, Sites publications and the artifacts core owns inside
// machines.
//
// Store is the contract the rest of corral uses; Open returns one of its
// two backends, chosen by the store URL:
//
//   - "sqlite:PATH" (or a bare path): one SQLite file, embedded, the
//     default (STATE/corral.db). Every corral process on the machine opens
//     the same file and sees the others' rows. See sqlite.go.
//   - "postgres://..." or "postgresql://..." (a libpq-style URL, or a
//     keyword/value string starting with "host=" and the like): a
//     PostgreSQL server, which several daemons on several hosts may share.
//     The password comes from the URL, PGPASSWORD or a passfile
//     (PGPASSFILE, ~/.pgpass), as libpq finds it; it is never logged nor
//     put in an error (Redact). See postgres.go.
//
// Both backends hold the same invariants, each the way its database is
// written: a command's start (its lease and its journal entry) and its end
// (the lease released and the entry finished) are one statement each; an
// entry is finished only by its own lease; every change to a project, its
// memberships or its egress policy bumps that project's tenancy version,
// which a command's lease insert checks; retention bounds the egress
// journal and each journal row's argv. The conformance suite (store tests,
// run against both) is what they share.
//
// A command's tenancy read (its project, the actor's membership and the
// project's egress policy) may come from memory (CachedTenancy): every
// change to a project, to its memberships or to its egress policy bumps
// that project's version in the database, and the command's lease insert
// checks its project's version, so that no decision taken on an outdated
// read is ever written, and one tenant's changes cost no other tenant a
// refused insert.
//
// The schema is versioned (SQLite's PRAGMA user_version, PostgreSQL's
// corral_schema table) and its migrations, one set per backend, are
// compiled into the binary. Exactly one kind of process should migrate (the
// daemon, or `corral run` on embedded defaults); the others open with
// Migrate false and refuse a schema they do not know.
//
// Times are stored as unix milliseconds and returned as time.Time values with
// millisecond precision; a zero time.Time means "not (yet)".
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-sandbox/corral/internal/errdefs"
)

// Errors callers branch on. Every error the package returns for these
// conditions wraps one of them; test with errors.Is.
var (
	// ErrNotFound: the row asked for does not exist (or, for Authenticate,
	// no live token matches).
	ErrNotFound = errdefs.New(errdefs.NotFound, "store: not found")
	// ErrExists: a row with the same unique key already exists.
	ErrExists = errdefs.New(errdefs.Conflict, "store: already exists")
	// ErrProjectBusy: the project has live leases and cannot be deleted.
	ErrProjectBusy = errdefs.New(errdefs.Conflict, "store: project has live leases")
	// ErrSchemaMismatch: the database's schema version is not the one this
	// binary knows and the store was opened without Migrate (or the
	// database is newer than this binary). The error is a *SchemaError.
	ErrSchemaMismatch = errors.New("store: schema version mismatch")
	// ErrLeaseExpired: the lease expired (or is past its expiry and about
	// to be expired by a reconciler).
	ErrLeaseExpired = errors.New("store: lease expired")
	// ErrLeaseReleased: the lease was released.
	ErrLeaseReleased = errors.New("store: lease released")
	// ErrNotMember: the account is not a member of the project (from
	// GetProjectMember, whose project exists). It also matches ErrNotFound.
	// ErrSoleOwner: deleting an account would leave a project without an
	// owner.
	ErrSoleOwner = errdefs.New(errdefs.Conflict, "store: the only owner of a project")
	ErrNotMember = errdefs.New(errdefs.Forbidden, "store: not a member")
	// ErrUnavailable: the database could not be reached, or the
	// connection to it failed during the call (PostgreSQL restarting, the
	// network between); what the call was to write may or may not have
	// been written. Retry later. It is errdefs.Unavailable.
	ErrUnavailable = errdefs.New(errdefs.Unavailable, "store: database unavailable")
)

// errNotMember is ErrNotMember, matching ErrNotFound too.
var errNotMember = fmt.Errorf("%w (%w)", ErrNotMember, ErrNotFound)

// SchemaError reports a database whose schema version differs from the one
// this binary knows. It matches ErrSchemaMismatch with errors.Is.
type SchemaError struct {
	Path string // the SQLite file, or the PostgreSQL URL without its password
	Have int    // the database's schema version; 0 for a new database
	Want int    // the latest version this binary knows
}

func (e *SchemaError) Error() string {
	switch {
	case e.Have < e.Want:
		return fmt.Sprintf("store: %s has schema version %d, this corral needs %d: it must be migrated by a process that may migrate", e.Path, e.Have, e.Want)
	default:
		return fmt.Sprintf("store: %s has schema version %d, newer than version %d this corral knows", e.Path, e.Have, e.Want)
	}
}

// Is reports whether target is ErrSchemaMismatch.
func (e *SchemaError) Is(target error) bool { return target == ErrSchemaMismatch }

// Options configure Open. The zero value opens an existing, up-to-date
// database without migrating, with the wall clock, a 5 s busy timeout
// and the default bounds of each backend.
type Options struct {
	// Migrate applies pending migrations, in one transaction, and (SQLite)
	// creates the file if it does not exist. Processes migrating the same
	// database at once apply each migration once: SQLite's write lock, or
	// PostgreSQL's advisory lock (MigrationLockID) taken in the migration's
	// transaction, orders them. If false, Open never writes the schema
	// and fails with a *SchemaError unless the database's version is exactly
	// the one this binary knows; a missing SQLite file, or a PostgreSQL
	// database without corral's tables, is such a database (version 0) and
	// is not created.
	Migrate bool

	// Now is the clock for the timestamps the store records itself
	// (creation, revocation, journal times). The lease methods take their
	// time from the caller instead. If nil, time.Now is used.
	Now func() time.Time

	// BusyTimeout is how long a statement waits for another process's
	// lock before it fails: SQLite's write lock (SQLITE_BUSY), or on
	// PostgreSQL a row lock or the migration lock (lock_timeout). If zero,
	// DefaultBusyTimeout.
	BusyTimeout time.Duration

	// ReadConns is the number of SQLite's read-only connections. If zero,
	// 4. PostgreSQL ignores it.
	ReadConns int

	// MaxConns bounds PostgreSQL's connection pool: a caller that finds
	// every connection in use waits for one (within its context). If zero,
	// DefaultMaxConns. SQLite ignores it.
	MaxConns int

	// ConnectTimeout bounds the opening of one PostgreSQL connection (the
	// dial, TLS and authentication). If zero, DefaultConnectTimeout, or the
	// URL's connect_timeout when it has one. SQLite ignores it.
	ConnectTimeout time.Duration
}

// The defaults of Options' zero fields.
const (
	DefaultBusyTimeout    = 5 * time.Second
	DefaultMaxConns       = 16
	DefaultConnectTimeout = 5 * time.Second
)

// Store is an open corral database. Its methods are safe for concurrent use
// by multiple goroutines. Close it when done.
type Store interface {
	// Close closes the database. It waits for statements in progress to
	// finish. Calling it more than once returns an error from the second
	// call on.
	Close() error

	// Path returns the absolute path of an SQLite database file, or ""
	// for a PostgreSQL store.
	Path() string

	// Now returns the current time of the store's clock (Options.Now).
	Now() time.Time

	// SchemaVersion returns the database's current schema version.
	SchemaVersion(ctx context.Context) (int, error)

	// Accounts and bearer tokens.
	// CreateAccount creates an account. A duplicate name is ErrExists.
	CreateAccount(ctx context.Context, name string) (Account, error)

	// GetAccount returns the account with the given ID, or ErrNotFound.
	GetAccount(ctx context.Context, id int64) (Account, error)

	// AccountByName returns the account with the given name, or ErrNotFound.
	AccountByName(ctx context.Context, name string) (Account, error)

	// ListAccounts returns every account, by ID.
	ListAccounts(ctx context.Context) ([]Account, error)

	// CreateToken mints a new bearer token for account and stores its hash. It
	// returns the plaintext, which cannot be recovered later. An unknown
	// account is ErrNotFound.
	CreateToken(ctx context.Context, account int64, name string) (string, Token, error)

	// Authenticate returns the account a live bearer token belongs to. A token
	// that is unknown or revoked is ErrNotFound; the error never says which.
	// The token is looked up by its hash, so the plaintext is never compared.
	// It records the token's use at most once per minute.
	Authenticate(ctx context.Context, plaintext string) (Account, error)

	// AuthenticateToken is Authenticate that also returns the token's ID (for
	// credentials derived from the token, which must end when it is revoked:
	// see LiveToken).
	AuthenticateToken(ctx context.Context, plaintext string) (Account, int64, error)

	// TokensByID returns the tokens with the given IDs that still exist
	// (revoked ones included, with Revoked set). A token whose account was
	// deleted no longer exists. One query, for any number of IDs.
	TokensByID(ctx context.Context, ids []int64) (map[int64]Token, error)

	// DeleteAccount deletes an account with its tokens and memberships. An
	// account that is the only owner of a project is refused with ErrSoleOwner
	// (make someone else owner, or delete the project, first). An unknown
	// account is ErrNotFound.
	DeleteAccount(ctx context.Context, id int64) error

	// RevokeToken revokes a token. Revoking a revoked token is a no-op; an
	// unknown token is ErrNotFound.
	RevokeToken(ctx context.Context, id int64) error

	// ListTokens returns the account's tokens (live and revoked), by ID. An
	// account of 0 lists every account's tokens.
	ListTokens(ctx context.Context, account int64) ([]Token, error)

	// Projects and memberships.
	// CreateProject creates a project. A duplicate name is ErrExists; an invalid
	// kind or an empty name or root is an error (not a sentinel).
	CreateProject(ctx context.Context, p NewProject) (Project, error)

	// GetProject returns the project with the given ID, or ErrNotFound.
	GetProject(ctx context.Context, id int64) (Project, error)

	// ProjectByName returns the project with the given name, or ErrNotFound.
	ProjectByName(ctx context.Context, name string) (Project, error)

	// ListProjects returns every project, by ID.
	ListProjects(ctx context.Context) ([]Project, error)

	// DeleteProject deletes a project with its members, lease history and
	// artifact records (the command journal keeps its rows). It refuses with
	// ErrProjectBusy while the project has a live lease; the check and the
	// deletion are one transaction, so no lease can be acquired in between. An
	// unknown project is ErrNotFound.
	DeleteProject(ctx context.Context, id int64) error

	// AddMember adds an account to a project. An existing membership is
	// ErrExists; an unknown project or account is ErrNotFound. A zero Role is
	// RoleMember.
	AddMember(ctx context.Context, m Member) (Member, error)

	// UpdateMember changes an existing membership's role and trust, or returns
	// ErrNotFound.
	UpdateMember(ctx context.Context, m Member) error

	// RemoveMember removes an account from a project, or returns ErrNotFound.
	RemoveMember(ctx context.Context, project, account int64) error

	// GetMember returns an account's membership of a project; a non-member is
	// ErrNotFound.
	GetMember(ctx context.Context, project, account int64) (Member, error)

	// GetProjectMember returns a project and an account's membership of it in
	// one read, which costs about half of GetProject followed by GetMember. An
	// unknown project is ErrNotFound (and zero values). For a non-member it
	// returns the project, a zero Member and an error wrapping ErrNotMember,
	// which also matches ErrNotFound.
	GetProjectMember(ctx context.Context, project, account int64) (Project, Member, error)

	// CreatedProjects returns how many projects account created: those it
	// is an owner of since before any other member joined (an owner added by
	// someone else does not count).
	CreatedProjects(ctx context.Context, account int64) (int, error)

	// ListMembers returns a project's members, by account ID.
	ListMembers(ctx context.Context, project int64) ([]Member, error)

	// SetProjectMachine records what a managed project's machine is built from:
	// its image (empty means DefaultImage) and its limits. A running machine
	// picks the change up at its next request (limits) or restart (image).
	// An unknown project is ErrNotFound.
	SetProjectMachine(ctx context.Context, id int64, image string, l MachineLimits) error

	// SetProjectNetwork records whether a host project's confined commands may
	// use the host's network; it applies from their next preparation. An
	// unknown project is ErrNotFound.
	SetProjectNetwork(ctx context.Context, id int64, network bool) error

	// ProjectsUsingImage returns the projects whose machine is built from the
	// named image, by ID.
	ProjectsUsingImage(ctx context.Context, image string) ([]Project, error)

	// The tenancy read of commands.
	// CachedTenancy returns what GetProjectMember returns, with the project's
	// egress policy and the version of the read, from memory when an earlier call read it. A cached result may
	// be out of date: the caller must make its decision take effect only
	// through CreateLease with NewLease.TenancyVersion set to the returned
	// Version, which refuses it (ErrTenancyChanged) if the tenancy changed
	// since, and drops the cached entry so that the next call reads again.
	// Only members are cached: a denial (ErrNotMember, ErrNotFound) is read
	// again on every call, so that a membership granted applies at once.
	CachedTenancy(ctx context.Context, project, account int64) (Tenancy, error)

	// Permissions beyond membership.
	// SetHostPaths grants (on) or revokes the use of host paths to an account:
	// creating host projects and managed projects copied from a host
	// directory, where the daemon permits host paths at all. It is idempotent;
	// an unknown account is ErrNotFound.
	SetHostPaths(ctx context.Context, account int64, on bool) error

	// HostPaths reports whether the account was granted host paths. An
	// unknown account is ErrNotFound.
	HostPaths(ctx context.Context, account int64) (bool, error)

	// SetExportRemotes sets the remote patterns a project may be exported to
	// (narrowing the daemon's); nil or empty means the daemon's alone. An
	// empty or multi-line pattern is refused with an error; an unknown project
	// is ErrNotFound.
	SetExportRemotes(ctx context.Context, project int64, patterns []string) error

	// ExportRemotes returns the project's export remote patterns (nil for
	// none). An unknown project is ErrNotFound.
	ExportRemotes(ctx context.Context, project int64) ([]string, error)

	// Egress policies and the egress journal.
	// SetEgressPolicy stores project's policy (JSON, validated by the caller:
	// package egress). An unknown project is ErrNotFound.
	SetEgressPolicy(ctx context.Context, project int64, policyJSON string) error

	// EgressPolicy returns project's stored policy JSON, "" when none was set
	// (mode none). It does not check that the project exists.
	// A managed command's session start reads it (package egress) when
	// its preparation did not read it with the tenancy
	// (Tenancy.EgressPolicy): a hot read.
	EgressPolicy(ctx context.Context, project int64) (string, error)

	// EgressPolicyAt is EgressPolicy with the project's tenancy version as of
	// the read (Tenancy.Version: every policy change bumps it, schema 17), by
	// which a caller applying policies read at different times can tell the
	// newer one. An unknown project is "" at version 0.
	EgressPolicyAt(ctx context.Context, project int64) (string, int64, error)

	// AppendEgress journals one connection attempt and returns its id. The
	// project's oldest rows beyond MaxEgressRows are deleted.
	AppendEgress(ctx context.Context, e EgressEntry) (int64, error)

	// EgressLog returns project's most recent journal rows, newest first, at
	// most limit of them (limit <= 0 means 100).
	EgressLog(ctx context.Context, project int64, limit int) ([]EgressEntry, error)

	// Sites publications and signed-cookie tokens.
	// PutPublication publishes p.Name for p.Project. Re-publishing a name the
	// same project holds replaces its port and owner and keeps its creation
	// time (idempotent); a name another project holds is ErrNameTaken; an
	// unknown project is ErrNotFound. The check and the write are one
	// transaction. It returns the stored row.
	PutPublication(ctx context.Context, p Publication) (Publication, error)

	// DeletePublication removes project's publication of name. A name the
	// project does not hold is ErrNotFound.
	DeletePublication(ctx context.Context, project int64, name string) error

	// GetPublication returns the publication of name, or ErrNotFound.
	GetPublication(ctx context.Context, name string) (Publication, error)

	// ListPublications returns project's publications by name.
	ListPublications(ctx context.Context, project int64) ([]Publication, error)

	// LiveToken returns the metadata of token id if it is live: an unknown or
	// revoked token is ErrNotFound. It records no use. The Sites gateway
	// calls it on every request it authorizes with a signed cookie, so that
	// revoking the token the cookie came from ends its access at once.
	LiveToken(ctx context.Context, id int64) (Token, error)

	// Leases.
	// CreateLease inserts a live lease that expires at at+TTL. An unknown
	// project is ErrNotFound; a duplicate ID is ErrExists; a tenancy changed
	// since n.TenancyVersion is ErrTenancyChanged.
	CreateLease(ctx context.Context, n NewLease, at time.Time) (Lease, error)

	// GetLease returns the lease with the given ID, or ErrNotFound.
	GetLease(ctx context.Context, id string) (Lease, error)

	// ListLeases returns the leases matching f, oldest first. Listing the live
	// leases reads only theirs; any other listing reads the project's lease
	// history, or the whole history if f.Project is zero.
	ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error)

	// LeasesByID returns the leases with the given IDs that exist, keyed by ID.
	LeasesByID(ctx context.Context, ids []string) (map[string]Lease, error)

	// LiveLeaseCount returns the number of live leases, overdue ones included.
	LiveLeaseCount(ctx context.Context) (int, error)

	// ProjectLiveLeases returns the number of live leases on a project, overdue
	// ones included. A caller that must not act under a live lease (workspace
	// reset, stopping an idle machine) checks it; only DeleteProject checks it
	// in the same transaction as its action.
	ProjectLiveLeases(ctx context.Context, project int64) (int, error)

	// HeartbeatLease extends a live lease to expire at at plus its TTL. It
	// fails with ErrLeaseExpired if the lease expired or is overdue,
	// ErrLeaseReleased if it was released, ErrNotFound if it does not exist.
	HeartbeatLease(ctx context.Context, id string, at time.Time) error

	// HeartbeatLeases heartbeats many leases in one transaction, which costs
	// far less per lease than one HeartbeatLease each. errs[i] is the outcome
	// for ids[i], as HeartbeatLease would report it; err is a failure of the
	// whole batch, in which case no lease was extended.
	HeartbeatLeases(ctx context.Context, ids []string, at time.Time) (errs []error, err error)

	// ReleaseLease releases a live lease and returns its row. Releasing a
	// released lease returns its row and nil: release is idempotent. A lease
	// that expired, or is overdue, is not released and the error wraps
	// ErrLeaseExpired (an overdue lease stays live until ExpireLeases marks it).
	// An unknown lease is ErrNotFound.
	ReleaseLease(ctx context.Context, id string, at time.Time) (Lease, error)

	// ReleaseHeldLease releases a lease as ReleaseLease does, with the same
	// outcomes and errors, but does not return the lease's row: it is for the
	// lease's holder, who has it, and costs less.
	ReleaseHeldLease(ctx context.Context, id string, at time.Time) error

	// ExpireLeases marks every overdue live lease (ExpiresAt before at) expired
	// and returns them, in their new state. Each lease is returned by exactly
	// one call, across every process sharing the database. When no lease is
	// overdue it only reads.
	ExpireLeases(ctx context.Context, at time.Time) ([]Lease, error)

	// The command journal and artifacts.
	// JournalStart records that a command starts now and returns its entry's
	// ID, which JournalFinish takes.
	JournalStart(ctx context.Context, in JournalCommand) (int64, error)

	// JournalFinish records how the command of entry id ended. An unknown or
	// already finished entry is ErrNotFound (an entry ends once).
	JournalFinish(ctx context.Context, id int64, end JournalEnd) error

	// ReleaseAndFinish releases a live lease (as ReleaseHeldLease does) and
	// records how the command of journal entry id ended (as JournalFinish
	// does), in one write: a command's end costs one statement and one commit
	// instead of two. journaled reports that the entry was finished with the
	// release (an entry no longer running, as JournalFinish would report
	// ErrNotFound, is left as it is).
	//
	// If the lease is not releasable at once, the entry is not touched
	// (journaled is false) and the lease is examined as ReleaseHeldLease
	// examines it: err then wraps ErrLeaseExpired or ErrNotFound, or is nil
	// for a lease released already (release is idempotent). An invalid end is
	// an error and nothing is written.
	ReleaseAndFinish(ctx context.Context, lease string, at time.Time, id int64, end JournalEnd) (journaled bool, err error)

	// JournalInterrupt marks every running entry of a lease interrupted with
	// message and returns how many it marked. A lease reconciler calls it for
	// the leases it expires: their commands can no longer report an end.
	JournalInterrupt(ctx context.Context, lease, message string) (int, error)

	// JournalInterruptReleased marks interrupted, with message, every running
	// entry whose lease was released before the given time, and returns how
	// many it marked. Such an entry's process released the lease and died
	// before recording the command's end (RunCommand releases, then its caller
	// journals the outcome): no expiry will close it. before leaves the live
	// process that is between the two writes its time.
	JournalInterruptReleased(ctx context.Context, before time.Time, message string) (int, error)

	// ListJournal returns the newest entries matching f, newest first.
	ListJournal(ctx context.Context, f JournalFilter) ([]JournalEntry, error)

	// RecordArtifact records a file core created. An unknown project is
	// ErrNotFound.
	RecordArtifact(ctx context.Context, project int64, path, lease string) (Artifact, error)

	// ListArtifacts returns a project's artifacts, oldest first; deleted ones
	// only if includeDeleted.
	ListArtifacts(ctx context.Context, project int64, includeDeleted bool) ([]Artifact, error)

	// MarkArtifactDeleted records that an artifact was deleted. Marking it again
	// is a no-op; an unknown artifact is ErrNotFound.
	MarkArtifactDeleted(ctx context.Context, id int64) error
}
