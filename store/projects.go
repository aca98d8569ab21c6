package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// ProjectKind says where a project's files live and how its commands run.
type ProjectKind string

const (
	// ProjectManaged: a workspace inside a managed machine.
	ProjectManaged ProjectKind = "managed"
	// ProjectHost: a directory on the host.
	ProjectHost ProjectKind = "host"
)

// Project is a unit of tenancy: a directory commands run in, and its members.
type Project struct {
	ID   int64
	Kind ProjectKind
	Name string
	// Root is the host directory of a host project, or the workspace
	// directory on the host of a managed project.
	Root    string
	Created time.Time
	// Image names the image of a managed project's machine ("base", the
	// embedded default, unless set).
	Image string
	// Limits override the worker's default limits of a managed project's
	// machine; a zero field means the default.
	Limits MachineLimits
	// Network lets a host project's confined commands use the host's
	// network (trusted members' commands always can). Managed projects
	// ignore it.
	Network bool
}

// MachineLimits are a machine's resource limits as a project records them. A zero
// field means the worker's default; a negative one means no limit.
type MachineLimits struct {
	Memory    int64 // bytes
	Pids      int64 // tasks
	CPUMillis int64 // thousandths of a CPU
	Disk      int64 // bytes: workspace, home and upper layer
	Tmp       int64 // bytes: /tmp and /dev/shm
}

// DefaultImage is the image of a project that names none.
const DefaultImage = "base"

// NewProject describes a project to create.
type NewProject struct {
	Kind ProjectKind
	Name string // unique
	Root string
	// Image is the managed machine's image; empty means DefaultImage.
	Image string
	// Limits override the worker's defaults; zero fields mean the default.
	Limits MachineLimits
	// Network: see Project.Network.
	Network bool
}

// Role is a member's role in a project.
type Role string

const (
	RoleOwner  Role = "owner"
	RoleMember Role = "member"
)

// Member is an account's membership of a project.
type Member struct {
	Project int64
	Account int64
	Role    Role
	// Trusted marks an actor the project trusts to run host commands
	// without confinement.
	Trusted bool
	Created time.Time
}

// newProject validates p and returns the project it creates, but for its
// ID.
func newProject(p NewProject, now func() time.Time) (Project, error) {
	if p.Kind != ProjectManaged && p.Kind != ProjectHost {
		return Project{}, fmt.Errorf("store: create project %q: invalid kind %q", p.Name, p.Kind)
	}
	if p.Name == "" || p.Root == "" {
		return Project{}, fmt.Errorf("store: create project: name and root are required")
	}
	if p.Image == "" {
		p.Image = DefaultImage
	}
	return Project{Kind: p.Kind, Name: p.Name, Root: p.Root, Created: stamp(now), Image: p.Image, Limits: p.Limits, Network: p.Network}, nil
}

func (s *sqliteStore) CreateProject(ctx context.Context, p NewProject) (Project, error) {
	out, err := newProject(p, s.now)
	if err != nil {
		return Project{}, err
	}
	l := p.Limits
	err = s.w.QueryRowContext(ctx,
		`INSERT INTO projects (kind, name, root, created_at, image, limit_memory, limit_pids, limit_cpu_millis, limit_disk, limit_tmp, network)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		string(p.Kind), p.Name, p.Root, ms(out.Created), out.Image, l.Memory, l.Pids, l.CPUMillis, l.Disk, l.Tmp, p.Network).Scan(&out.ID)
	if err != nil {
		return Project{}, classifyExists(err, fmt.Sprintf("project %q", p.Name), fmt.Sprintf("create project %q", p.Name))
	}
	return out, nil
}

const (
	projectCols   = "id, kind, name, root, created_at, image, limit_memory, limit_pids, limit_cpu_millis, limit_disk, limit_tmp, network"
	sqlGetProject = "SELECT " + projectCols + " FROM projects WHERE id = ?"
	sqlGetMember  = "SELECT project, account, role, trusted, created_at FROM members WHERE project = ? AND account = ?"
	sqlGetTenancy = `SELECT p.id, p.kind, p.name, p.root, p.created_at, p.image, p.limit_memory, p.limit_pids,
		p.limit_cpu_millis, p.limit_disk, p.limit_tmp, p.network, m.role, m.trusted, m.created_at,
		p.tenancy_version, e.policy
		FROM projects p LEFT JOIN members m ON m.project = p.id AND m.account = ?2
		LEFT JOIN egress_policies e ON e.project = p.id WHERE p.id = ?1`
)

func scanProject(r scanner, what string) (Project, error) {
	var (
		p       Project
		kind    string
		created int64
	)
	l := &p.Limits
	if err := r.Scan(&p.ID, &kind, &p.Name, &p.Root, &created, &p.Image, &l.Memory, &l.Pids, &l.CPUMillis, &l.Disk, &l.Tmp, &p.Network); err != nil {
		return Project{}, classify(err, what)
	}
	p.Kind, p.Created = ProjectKind(kind), fromMS(created)
	return p, nil
}

func (s *sqliteStore) GetProject(ctx context.Context, id int64) (Project, error) {
	st, err := s.readStmt(ctx, sqlGetProject)
	if err != nil {
		return Project{}, err
	}
	return scanProject(st.QueryRowContext(ctx, id), fmt.Sprintf("project %d", id))
}

func (s *sqliteStore) ProjectByName(ctx context.Context, name string) (Project, error) {
	return scanProject(s.r.QueryRowContext(ctx, "SELECT "+projectCols+" FROM projects WHERE name = ?", name),
		fmt.Sprintf("project %q", name))
}

func (s *sqliteStore) ListProjects(ctx context.Context) ([]Project, error) {
	rows, err := s.r.QueryContext(ctx, "SELECT "+projectCols+" FROM projects ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("store: list projects: %w", err)
	}
	defer rows.Close()
	var out []Project
	for rows.Next() {
		p, err := scanProject(rows, "list projects")
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list projects: %w", err)
	}
	return out, nil
}

func (s *sqliteStore) DeleteProject(ctx context.Context, id int64) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var live int
		if err := tx.QueryRowContext(ctx, sqlCountProjectLive, id).Scan(&live); err != nil {
			return fmt.Errorf("store: delete project %d: %w", id, err)
		}
		if live > 0 {
			return fmt.Errorf("store: delete project %d: %d live lease(s): %w", id, live, ErrProjectBusy)
		}
		res, err := tx.ExecContext(ctx, "DELETE FROM projects WHERE id = ?", id)
		if err != nil {
			return fmt.Errorf("store: delete project %d: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("store: delete project %d: %w", id, ErrNotFound)
		}
		return nil
	})
}

func (s *sqliteStore) AddMember(ctx context.Context, m Member) (Member, error) {
	if m.Role == "" {
		m.Role = RoleMember
	}
	if m.Role != RoleOwner && m.Role != RoleMember {
		return Member{}, fmt.Errorf("store: add member: invalid role %q", m.Role)
	}
	// A membership is strictly younger than the project's earlier ones,
	// so that the first (its creator's, see CreatedProjects) is the only
	// one without an earlier.
	var created int64
	err := s.w.QueryRowContext(ctx,
		`INSERT INTO members (project, account, role, trusted, created_at) VALUES (?1, ?2, ?3, ?4,
			max(?5, coalesce((SELECT max(created_at) + 1 FROM members WHERE project = ?1), 0))) RETURNING created_at`,
		m.Project, m.Account, string(m.Role), m.Trusted, ms(stamp(s.now))).Scan(&created)
	m.Created = fromMS(created)
	if err != nil {
		return Member{}, classifyExists(err, fmt.Sprintf("the membership of account %d in project %d", m.Account, m.Project), fmt.Sprintf("add account %d to project %d", m.Account, m.Project))
	}
	return m, nil
}

func (s *sqliteStore) UpdateMember(ctx context.Context, m Member) error {
	if m.Role != RoleOwner && m.Role != RoleMember {
		return fmt.Errorf("store: update member: invalid role %q", m.Role)
	}
	res, err := s.w.ExecContext(ctx, "UPDATE members SET role = ?, trusted = ? WHERE project = ? AND account = ?",
		string(m.Role), m.Trusted, m.Project, m.Account)
	if err != nil {
		return fmt.Errorf("store: update member: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: account %d in project %d: %w", m.Account, m.Project, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) RemoveMember(ctx context.Context, project, account int64) error {
	res, err := s.w.ExecContext(ctx, "DELETE FROM members WHERE project = ? AND account = ?", project, account)
	if err != nil {
		return fmt.Errorf("store: remove member: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: account %d in project %d: %w", account, project, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) GetMember(ctx context.Context, project, account int64) (Member, error) {
	st, err := s.readStmt(ctx, sqlGetMember)
	if err != nil {
		return Member{}, err
	}
	return scanMember(st.QueryRowContext(ctx, project, account), fmt.Sprintf("account %d in project %d", account, project))
}

func (s *sqliteStore) GetProjectMember(ctx context.Context, project, account int64) (Project, Member, error) {
	t, err := s.readTenancy(ctx, project, account)
	return t.Project, t.Member, err
}

// readTenancy is GetProjectMember, with the tenancy version of the read.
func (s *sqliteStore) readTenancy(ctx context.Context, project, account int64) (Tenancy, error) {
	st, err := s.readStmt(ctx, sqlGetTenancy)
	if err != nil {
		return Tenancy{}, err
	}
	hctx, err := hot(ctx)
	if err != nil {
		return Tenancy{}, fmt.Errorf("store: project %d: %w", project, err)
	}
	return scanTenancy(st.QueryRowContext(hctx, project, account), project, account)
}

// scanTenancy scans the row of a tenancy read (sqlGetTenancy's columns).
func scanTenancy(r scanner, project, account int64) (Tenancy, error) {
	var (
		p       Project
		kind    string
		created int64
		role    sql.NullString
		trusted sql.NullBool
		joined  sql.NullInt64
		version int64
		policy  sql.NullString
	)
	err := r.Scan(&p.ID, &kind, &p.Name, &p.Root, &created,
		&p.Image, &p.Limits.Memory, &p.Limits.Pids, &p.Limits.CPUMillis, &p.Limits.Disk, &p.Limits.Tmp, &p.Network, &role, &trusted, &joined, &version, &policy)
	if err != nil {
		return Tenancy{}, classify(err, fmt.Sprintf("project %d", project))
	}
	p.Kind, p.Created = ProjectKind(kind), fromMS(created)
	if !role.Valid {
		return Tenancy{Project: p}, fmt.Errorf("store: account %d in project %d: %w", account, project, errNotMember)
	}
	m := Member{Project: project, Account: account, Role: Role(role.String), Trusted: trusted.Bool, Created: fromMS(joined.Int64)}
	return Tenancy{Project: p, Member: m, Version: version, EgressPolicy: policy.String}, nil
}

func (s *sqliteStore) CreatedProjects(ctx context.Context, account int64) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM members m WHERE m.account = ? AND m.role = ? AND NOT EXISTS
		(SELECT 1 FROM members o WHERE o.project = m.project AND o.created_at < m.created_at)`, account, RoleOwner).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: created projects: %w", err)
	}
	return n, nil
}

func (s *sqliteStore) ListMembers(ctx context.Context, project int64) ([]Member, error) {
	rows, err := s.r.QueryContext(ctx,
		"SELECT project, account, role, trusted, created_at FROM members WHERE project = ? ORDER BY account", project)
	if err != nil {
		return nil, fmt.Errorf("store: list members: %w", err)
	}
	defer rows.Close()
	var out []Member
	for rows.Next() {
		m, err := scanMember(rows, "list members")
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list members: %w", err)
	}
	return out, nil
}

func scanMember(r scanner, what string) (Member, error) {
	var (
		m       Member
		role    string
		created int64
	)
	if err := r.Scan(&m.Project, &m.Account, &role, &m.Trusted, &created); err != nil {
		return Member{}, classify(err, what)
	}
	m.Role, m.Created = Role(role), fromMS(created)
	return m, nil
}

func (s *sqliteStore) SetProjectMachine(ctx context.Context, id int64, image string, l MachineLimits) error {
	if image == "" {
		image = DefaultImage
	}
	res, err := s.w.ExecContext(ctx,
		`UPDATE projects SET image = ?, limit_memory = ?, limit_pids = ?, limit_cpu_millis = ?, limit_disk = ?, limit_tmp = ?
		WHERE id = ?`, image, l.Memory, l.Pids, l.CPUMillis, l.Disk, l.Tmp, id)
	if err != nil {
		return classify(err, fmt.Sprintf("set machine of project %d", id))
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("store: project %d: %w", id, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) SetProjectNetwork(ctx context.Context, id int64, network bool) error {
	res, err := s.w.ExecContext(ctx, "UPDATE projects SET network = ? WHERE id = ?", network, id)
	if err != nil {
		return classify(err, fmt.Sprintf("set network of project %d", id))
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("store: project %d: %w", id, ErrNotFound)
	}
	return nil
}

func (s *sqliteStore) ProjectsUsingImage(ctx context.Context, image string) ([]Project, error) {
	rows, err := s.r.QueryContext(ctx, "SELECT "+projectCols+" FROM projects WHERE image = ? ORDER BY id", image)
	if err != nil {
		return nil, fmt.Errorf("store: projects using image %q: %w", image, err)
	}
	defer rows.Close()
	var out []Project
	for rows.Next() {
		p, err := scanProject(rows, "projects using image")
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
