package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The PostgreSQL backend's accounts, tokens, grants and the Sites' token
// check.

func (s *pgStore) CreateAccount(ctx context.Context, name string) (Account, error) {
	a := Account{Name: name, Created: stamp(s.now)}
	err := s.pool.QueryRow(ctx, "INSERT INTO accounts (name, created_at) VALUES ($1, $2) RETURNING id",
		name, ms(a.Created)).Scan(&a.ID)
	if err != nil {
		return Account{}, classifyExists(err, "account "+strconvQuote(name), "create account "+strconvQuote(name))
	}
	return a, nil
}

func (s *pgStore) GetAccount(ctx context.Context, id int64) (Account, error) {
	return scanAccount(s.pool.QueryRow(ctx, "SELECT id, name, created_at FROM accounts WHERE id = $1", id),
		fmt.Sprintf("account %d", id))
}

func (s *pgStore) AccountByName(ctx context.Context, name string) (Account, error) {
	return scanAccount(s.pool.QueryRow(ctx, "SELECT id, name, created_at FROM accounts WHERE name = $1", name),
		"account "+strconvQuote(name))
}

func (s *pgStore) ListAccounts(ctx context.Context) ([]Account, error) {
	return pgList(ctx, s, "list accounts", func(r scanner) (Account, error) { return scanAccount(r, "list accounts") },
		"SELECT id, name, created_at FROM accounts ORDER BY id")
}

// pgList runs query and scans each of its rows with scan.
func pgList[T any](ctx context.Context, s *pgStore, what string, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, pgErr(err))
	}
	defer rows.Close()
	out, err := collect(rows, scan)
	if err != nil {
		return nil, classify(err, what)
	}
	return out, nil
}

func (s *pgStore) CreateToken(ctx context.Context, account int64, name string) (string, Token, error) {
	plaintext, err := newToken()
	if err != nil {
		return "", Token{}, err
	}
	t := Token{Account: account, Name: name, Created: stamp(s.now)}
	err = s.pool.QueryRow(ctx,
		"INSERT INTO tokens (account, hash, name, created_at) VALUES ($1, $2, $3, $4) RETURNING id",
		account, HashToken(plaintext), name, ms(t.Created)).Scan(&t.ID)
	if err != nil {
		return "", Token{}, classifyExists(err, "the token", fmt.Sprintf("create token for account %d", account))
	}
	return plaintext, t, nil
}

func (s *pgStore) Authenticate(ctx context.Context, plaintext string) (Account, error) {
	a, _, err := s.AuthenticateToken(ctx, plaintext)
	return a, err
}

func (s *pgStore) AuthenticateToken(ctx context.Context, plaintext string) (Account, int64, error) {
	if !strings.HasPrefix(plaintext, TokenPrefix) {
		return Account{}, 0, fmt.Errorf("store: authenticate: %w", ErrNotFound)
	}
	var (
		a        Account
		tokenID  int64
		created  int64
		lastUsed sql.NullInt64
	)
	err := s.pool.QueryRow(ctx, `SELECT a.id, a.name, a.created_at, t.id, t.last_used_at
		FROM tokens t JOIN accounts a ON a.id = t.account
		WHERE t.hash = $1 AND t.revoked_at IS NULL`, HashToken(plaintext)).Scan(&a.ID, &a.Name, &created, &tokenID, &lastUsed)
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, 0, fmt.Errorf("store: authenticate: %w", ErrNotFound)
	}
	if err != nil {
		return Account{}, 0, fmt.Errorf("store: authenticate: %w", pgErr(err))
	}
	a.Created = fromMS(created)
	now := s.now()
	if !lastUsed.Valid || now.Sub(fromMS(lastUsed.Int64)) >= lastUsedGranularity {
		if _, err := s.pool.Exec(ctx, "UPDATE tokens SET last_used_at = $1 WHERE id = $2", ms(now), tokenID); err != nil {
			return Account{}, 0, fmt.Errorf("store: authenticate: record use: %w", pgErr(err))
		}
	}
	return a, tokenID, nil
}

const pgTokenCols = "id, account, name, created_at, last_used_at, revoked_at"

func (s *pgStore) TokensByID(ctx context.Context, ids []int64) (map[int64]Token, error) {
	out := make(map[int64]Token, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	list, err := pgList(ctx, s, "tokens by id", scanToken, "SELECT "+pgTokenCols+" FROM tokens WHERE id = ANY($1)", ids)
	for _, t := range list {
		out[t.ID] = t
	}
	return out, err
}

func (s *pgStore) DeleteAccount(ctx context.Context, id int64) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		var name string
		// The account's row, locked: no membership of it is added meanwhile.
		if err := tx.QueryRow(ctx, "SELECT name FROM accounts WHERE id = $1 FOR UPDATE", id).Scan(&name); err != nil {
			return classify(err, fmt.Sprintf("account %d", id))
		}
		var sole string
		err := tx.QueryRow(ctx, `
			SELECT p.name FROM members m JOIN projects p ON p.id = m.project
			WHERE m.account = $1 AND m.role = 'owner'
			AND NOT EXISTS (SELECT 1 FROM members o WHERE o.project = m.project AND o.role = 'owner' AND o.account <> m.account)
			ORDER BY p.id LIMIT 1`, id).Scan(&sole)
		switch {
		case err == nil:
			return fmt.Errorf("store: account %q is the only owner of project %q: %w", name, sole, ErrSoleOwner)
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("store: delete account %d: %w", id, pgErr(err))
		}
		// Its memberships go with it: each of their projects' tenancy
		// changes, in the same statement.
		if _, err := tx.Exec(ctx, `WITH gone AS (DELETE FROM accounts WHERE id = $1),
			bumped AS (UPDATE projects SET tenancy_version = tenancy_version + 1
				WHERE id IN (SELECT project FROM members WHERE account = $1))
			SELECT 1`, id); err != nil {
			return fmt.Errorf("store: delete account %d: %w", id, pgErr(err))
		}
		return nil
	})
}

func (s *pgStore) RevokeToken(ctx context.Context, id int64) error {
	return s.setOnce(ctx, "tokens", "revoked_at", id, fmt.Sprintf("revoke token %d", id))
}

// setOnce sets the time column of row id of table to now unless it is set
// already (a revocation, a deletion mark: the first one's time stays), in
// one statement. A missing row is ErrNotFound.
func (s *pgStore) setOnce(ctx context.Context, table, column string, id int64, what string) error {
	var found bool
	err := s.pool.QueryRow(ctx, `WITH t AS (SELECT id, `+column+` AS v FROM `+table+` WHERE id = $1 FOR UPDATE),
		u AS (UPDATE `+table+` SET `+column+` = $2 WHERE id IN (SELECT id FROM t WHERE v IS NULL))
		SELECT EXISTS (SELECT 1 FROM t)`, id, ms(s.now())).Scan(&found)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, pgErr(err))
	}
	if !found {
		return fmt.Errorf("store: %s: %w", what, ErrNotFound)
	}
	return nil
}

func (s *pgStore) ListTokens(ctx context.Context, account int64) ([]Token, error) {
	return pgList(ctx, s, "list tokens", scanToken,
		"SELECT "+pgTokenCols+" FROM tokens WHERE account = $1 OR $1 = 0 ORDER BY id", account)
}

func (s *pgStore) LiveToken(ctx context.Context, id int64) (Token, error) {
	var (
		t        Token
		created  int64
		lastUsed sql.NullInt64
	)
	err := s.pool.QueryRow(ctx, "SELECT id, account, name, created_at, last_used_at FROM tokens WHERE id = $1 AND revoked_at IS NULL", id).
		Scan(&t.ID, &t.Account, &t.Name, &created, &lastUsed)
	if err != nil {
		return Token{}, classify(err, fmt.Sprintf("token %d", id))
	}
	t.Created, t.LastUsed = fromMS(created), fromNullMS(lastUsed)
	return t, nil
}

func (s *pgStore) SetHostPaths(ctx context.Context, account int64, on bool) error {
	return s.execOne(ctx, fmt.Sprintf("account %d", account), "UPDATE accounts SET host_paths = $1 WHERE id = $2", on, account)
}

// execOne runs a statement that must change a row: none is ErrNotFound
// (of subject).
func (s *pgStore) execOne(ctx context.Context, subject, query string, args ...any) error {
	tag, err := s.pool.Exec(ctx, query, args...)
	if err != nil {
		return classify(err, subject)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("store: %s: %w", subject, ErrNotFound)
	}
	return nil
}

func (s *pgStore) HostPaths(ctx context.Context, account int64) (bool, error) {
	var v bool
	err := s.pool.QueryRow(ctx, "SELECT host_paths FROM accounts WHERE id = $1", account).Scan(&v)
	if err != nil {
		return false, classify(err, fmt.Sprintf("account %d", account))
	}
	return v, nil
}
