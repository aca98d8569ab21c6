package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL backend's projects, memberships and their tenancy.
//
// Every statement that changes a project's row, one of its memberships or
// its egress policy raises the project's tenancy_version itself, in the
// same statement (SQLite's triggers of schemas 16 and 17).

func (s *pgStore) CreateProject(ctx context.Context, p NewProject) (Project, error) {
	out, err := newProject(p, s.now)
	if err != nil {
		return Project{}, err
	}
	l := p.Limits
	err = s.pool.QueryRow(ctx,
		`INSERT INTO projects (kind, name, root, created_at, image, limit_memory, limit_pids, limit_cpu_millis, limit_disk, limit_tmp, network)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id`,
		string(p.Kind), p.Name, p.Root, ms(out.Created), out.Image, l.Memory, l.Pids, l.CPUMillis, l.Disk, l.Tmp, p.Network).Scan(&out.ID)
	if err != nil {
		return Project{}, classifyExists(err, fmt.Sprintf("project %q", p.Name), fmt.Sprintf("create project %q", p.Name))
	}
	return out, nil
}

func (s *pgStore) GetProject(ctx context.Context, id int64) (Project, error) {
	return scanProject(s.pool.QueryRow(ctx, "SELECT "+projectCols+" FROM projects WHERE id = $1", id), fmt.Sprintf("project %d", id))
}

func (s *pgStore) ProjectByName(ctx context.Context, name string) (Project, error) {
	return scanProject(s.pool.QueryRow(ctx, "SELECT "+projectCols+" FROM projects WHERE name = $1", name),
		fmt.Sprintf("project %q", name))
}

func (s *pgStore) ListProjects(ctx context.Context) ([]Project, error) {
	return pgList(ctx, s, "list projects", func(r scanner) (Project, error) { return scanProject(r, "list projects") },
		"SELECT "+projectCols+" FROM projects ORDER BY id")
}

func (s *pgStore) ProjectsUsingImage(ctx context.Context, image string) ([]Project, error) {
	return pgList(ctx, s, "projects using image", func(r scanner) (Project, error) { return scanProject(r, "projects using image") },
		"SELECT "+projectCols+" FROM projects WHERE image = $1 ORDER BY id", image)
}

func (s *pgStore) DeleteProject(ctx context.Context, id int64) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		// The row lock first: a lease insert (its foreign key check)
		// waits for it, so the count below is the last word.
		var found int64
		if err := tx.QueryRow(ctx, "SELECT id FROM projects WHERE id = $1 FOR UPDATE", id).Scan(&found); err != nil {
			return classify(err, fmt.Sprintf("delete project %d", id))
		}
		var live int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM lease_clock WHERE project = $1", id).Scan(&live); err != nil {
			return fmt.Errorf("store: delete project %d: %w", id, pgErr(err))
		}
		if live > 0 {
			return fmt.Errorf("store: delete project %d: %d live lease(s): %w", id, live, ErrProjectBusy)
		}
		if _, err := tx.Exec(ctx, "DELETE FROM projects WHERE id = $1", id); err != nil {
			return fmt.Errorf("store: delete project %d: %w", id, pgErr(err))
		}
		return nil
	})
}

func (s *pgStore) AddMember(ctx context.Context, m Member) (Member, error) {
	if m.Role == "" {
		m.Role = RoleMember
	}
	if m.Role != RoleOwner && m.Role != RoleMember {
		return Member{}, fmt.Errorf("store: add member: invalid role %q", m.Role)
	}
	// The project's row, locked by its version's raise, orders the
	// project's memberships: the insert, a statement later, sees every
	// earlier one, and is strictly younger (see CreatedProjects).
	what := fmt.Sprintf("add account %d to project %d", m.Account, m.Project)
	err := s.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, "UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id = $1", m.Project)
		if err != nil {
			return classify(err, what)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("store: %s: %w", what, ErrNotFound)
		}
		var created int64
		err = tx.QueryRow(ctx, `INSERT INTO members (project, account, role, trusted, created_at)
			SELECT $1, $2, $3, $4, greatest($5, coalesce((SELECT max(created_at) + 1 FROM members WHERE project = $1), 0))
			RETURNING created_at`,
			m.Project, m.Account, string(m.Role), m.Trusted, ms(stamp(s.now))).Scan(&created)
		if err != nil {
			return classifyExists(err, fmt.Sprintf("the membership of account %d in project %d", m.Account, m.Project), what)
		}
		m.Created = fromMS(created)
		return nil
	})
	if err != nil {
		return Member{}, err
	}
	return m, nil
}

func (s *pgStore) UpdateMember(ctx context.Context, m Member) error {
	if m.Role != RoleOwner && m.Role != RoleMember {
		return fmt.Errorf("store: update member: invalid role %q", m.Role)
	}
	return s.memberChange(ctx, m.Project, m.Account, "update member",
		"UPDATE members SET role = $3, trusted = $4 WHERE project = $1 AND account = $2 RETURNING project", string(m.Role), m.Trusted)
}

func (s *pgStore) RemoveMember(ctx context.Context, project, account int64) error {
	return s.memberChange(ctx, project, account, "remove member",
		"DELETE FROM members WHERE project = $1 AND account = $2 RETURNING project")
}

// memberChange runs change, a statement on the membership of account in
// project ($1, $2; then args) that returns the project of the rows it
// changed, and raises that project's tenancy version in the same
// statement. No membership changed is ErrNotFound.
func (s *pgStore) memberChange(ctx context.Context, project, account int64, what, change string, args ...any) error {
	var n int
	err := s.pool.QueryRow(ctx, `WITH m AS (`+change+`),
		p AS (UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id IN (SELECT project FROM m))
		SELECT count(*) FROM m`, append([]any{project, account}, args...)...).Scan(&n)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, pgErr(err))
	}
	if n == 0 {
		return fmt.Errorf("store: account %d in project %d: %w", account, project, ErrNotFound)
	}
	return nil
}

func (s *pgStore) GetMember(ctx context.Context, project, account int64) (Member, error) {
	return scanMember(s.pool.QueryRow(ctx, "SELECT project, account, role, trusted, created_at FROM members WHERE project = $1 AND account = $2", project, account),
		fmt.Sprintf("account %d in project %d", account, project))
}

func (s *pgStore) GetProjectMember(ctx context.Context, project, account int64) (Project, Member, error) {
	t, err := s.readTenancy(ctx, project, account)
	return t.Project, t.Member, err
}

func (s *pgStore) CachedTenancy(ctx context.Context, project, account int64) (Tenancy, error) {
	return s.tenancy.get(ctx, project, account, s.readTenancy)
}

func (s *pgStore) readTenancy(ctx context.Context, project, account int64) (Tenancy, error) {
	return scanTenancy(s.pool.QueryRow(ctx, `SELECT p.id, p.kind, p.name, p.root, p.created_at, p.image, p.limit_memory, p.limit_pids,
		p.limit_cpu_millis, p.limit_disk, p.limit_tmp, p.network, m.role, m.trusted, m.created_at,
		p.tenancy_version, e.policy
		FROM projects p LEFT JOIN members m ON m.project = p.id AND m.account = $2
		LEFT JOIN egress_policies e ON e.project = p.id WHERE p.id = $1`, project, account), project, account)
}

func (s *pgStore) CreatedProjects(ctx context.Context, account int64) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM members m WHERE m.account = $1 AND m.role = $2 AND NOT EXISTS
		(SELECT 1 FROM members o WHERE o.project = m.project AND o.created_at < m.created_at)`, account, string(RoleOwner)).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: created projects: %w", pgErr(err))
	}
	return n, nil
}

func (s *pgStore) ListMembers(ctx context.Context, project int64) ([]Member, error) {
	return pgList(ctx, s, "list members", func(r scanner) (Member, error) { return scanMember(r, "list members") },
		"SELECT project, account, role, trusted, created_at FROM members WHERE project = $1 ORDER BY account", project)
}

func (s *pgStore) SetProjectMachine(ctx context.Context, id int64, image string, l MachineLimits) error {
	if image == "" {
		image = DefaultImage
	}
	return s.execOne(ctx, fmt.Sprintf("project %d", id), `UPDATE projects SET image = $1, limit_memory = $2, limit_pids = $3,
		limit_cpu_millis = $4, limit_disk = $5, limit_tmp = $6, tenancy_version = tenancy_version + 1 WHERE id = $7`,
		image, l.Memory, l.Pids, l.CPUMillis, l.Disk, l.Tmp, id)
}

func (s *pgStore) SetProjectNetwork(ctx context.Context, id int64, network bool) error {
	return s.execOne(ctx, fmt.Sprintf("project %d", id),
		"UPDATE projects SET network = $1, tenancy_version = tenancy_version + 1 WHERE id = $2", network, id)
}

func (s *pgStore) SetExportRemotes(ctx context.Context, project int64, patterns []string) error {
	v, err := exportRemotes(patterns)
	if err != nil {
		return err
	}
	return s.execOne(ctx, fmt.Sprintf("project %d", project),
		"UPDATE projects SET export_remotes = $1, tenancy_version = tenancy_version + 1 WHERE id = $2", v, project)
}

func (s *pgStore) ExportRemotes(ctx context.Context, project int64) ([]string, error) {
	var v string
	if err := s.pool.QueryRow(ctx, "SELECT export_remotes FROM projects WHERE id = $1", project).Scan(&v); err != nil {
		return nil, classify(err, fmt.Sprintf("project %d", project))
	}
	if v == "" {
		return nil, nil
	}
	return strings.Split(v, "\n"), nil
}
