package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Account is a principal commands run for.
type Account struct {
	ID      int64
	Name    string
	Created time.Time
}

// Token is a bearer token's metadata. The token itself is shown once, by
// CreateToken, and never stored: the store keeps only its SHA-256.
type Token struct {
	ID       int64
	Account  int64
	Name     string
	Created  time.Time
	LastUsed time.Time // zero if never used
	Revoked  time.Time // zero if live
}

// TokenPrefix starts every bearer token CreateToken mints, so that secret
// scanners and log redaction can recognize one.
const TokenPrefix = "corral_"

// lastUsedGranularity bounds how often Authenticate writes last_used_at for
// one token: authentication is a read unless the recorded use is older.
const lastUsedGranularity = time.Minute

func (s *sqliteStore) CreateAccount(ctx context.Context, name string) (Account, error) {
	a := Account{Name: name, Created: stamp(s.now)}
	err := s.w.QueryRowContext(ctx,
		"INSERT INTO accounts (name, created_at) VALUES (?, ?) RETURNING id",
		name, ms(a.Created)).Scan(&a.ID)
	if err != nil {
		return Account{}, classifyExists(err, "account "+strconvQuote(name), "create account "+strconvQuote(name))
	}
	return a, nil
}

func (s *sqliteStore) GetAccount(ctx context.Context, id int64) (Account, error) {
	return scanAccount(s.r.QueryRowContext(ctx, "SELECT id, name, created_at FROM accounts WHERE id = ?", id),
		fmt.Sprintf("account %d", id))
}

func (s *sqliteStore) AccountByName(ctx context.Context, name string) (Account, error) {
	return scanAccount(s.r.QueryRowContext(ctx, "SELECT id, name, created_at FROM accounts WHERE name = ?", name),
		"account "+strconvQuote(name))
}

func (s *sqliteStore) ListAccounts(ctx context.Context) ([]Account, error) {
	rows, err := s.r.QueryContext(ctx, "SELECT id, name, created_at FROM accounts ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("store: list accounts: %w", err)
	}
	defer rows.Close()
	var out []Account
	for rows.Next() {
		a, err := scanAccount(rows, "list accounts")
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list accounts: %w", err)
	}
	return out, nil
}

func scanAccount(r scanner, what string) (Account, error) {
	var a Account
	var created int64
	if err := r.Scan(&a.ID, &a.Name, &created); err != nil {
		return Account{}, classify(err, what)
	}
	a.Created = fromMS(created)
	return a, nil
}

// HashToken returns the form in which a bearer token is stored: the
// lowercase hex SHA-256 of its plaintext.
func HashToken(plaintext string) string {
	sum := sha256.Sum256([]byte(plaintext))
	return hex.EncodeToString(sum[:])
}

func (s *sqliteStore) CreateToken(ctx context.Context, account int64, name string) (string, Token, error) {
	plaintext, err := newToken()
	if err != nil {
		return "", Token{}, err
	}
	t := Token{Account: account, Name: name, Created: stamp(s.now)}
	err = s.w.QueryRowContext(ctx,
		"INSERT INTO tokens (account, hash, name, created_at) VALUES (?, ?, ?, ?) RETURNING id",
		account, HashToken(plaintext), name, ms(t.Created)).Scan(&t.ID)
	if err != nil {
		return "", Token{}, classifyExists(err, "the token", fmt.Sprintf("create token for account %d", account))
	}
	return plaintext, t, nil
}

// newToken returns a new bearer token's plaintext.
func newToken() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("store: create token: %w", err)
	}
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:]), nil
}

// sqlAuthenticate finds a live token's account by the token's hash; every
// daemon request runs it.
const sqlAuthenticate = `SELECT a.id, a.name, a.created_at, t.id, t.last_used_at
	FROM tokens t JOIN accounts a ON a.id = t.account
	WHERE t.hash = ? AND t.revoked_at IS NULL`

func (s *sqliteStore) Authenticate(ctx context.Context, plaintext string) (Account, error) {
	a, _, err := s.AuthenticateToken(ctx, plaintext)
	return a, err
}

func (s *sqliteStore) AuthenticateToken(ctx context.Context, plaintext string) (Account, int64, error) {
	if !strings.HasPrefix(plaintext, TokenPrefix) {
		return Account{}, 0, fmt.Errorf("store: authenticate: %w", ErrNotFound)
	}
	var (
		a        Account
		tokenID  int64
		created  int64
		lastUsed sql.NullInt64
	)
	st, err := s.readStmt(ctx, sqlAuthenticate)
	if err != nil {
		return Account{}, 0, err
	}
	hctx, err := hot(ctx)
	if err != nil {
		return Account{}, 0, fmt.Errorf("store: authenticate: %w", err)
	}
	err = st.QueryRowContext(hctx, HashToken(plaintext)).Scan(&a.ID, &a.Name, &created, &tokenID, &lastUsed)
	if errors.Is(err, sql.ErrNoRows) {
		return Account{}, 0, fmt.Errorf("store: authenticate: %w", ErrNotFound)
	}
	if err != nil {
		return Account{}, 0, fmt.Errorf("store: authenticate: %w", err)
	}
	a.Created = fromMS(created)
	now := s.now()
	if !lastUsed.Valid || now.Sub(fromMS(lastUsed.Int64)) >= lastUsedGranularity {
		if _, err := s.w.ExecContext(ctx, "UPDATE tokens SET last_used_at = ? WHERE id = ?", ms(now), tokenID); err != nil {
			return Account{}, 0, fmt.Errorf("store: authenticate: record use: %w", err)
		}
	}
	return a, tokenID, nil
}

func (s *sqliteStore) TokensByID(ctx context.Context, ids []int64) (map[int64]Token, error) {
	out := make(map[int64]Token, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.r.QueryContext(ctx, `
		SELECT id, account, name, created_at, last_used_at, revoked_at
		FROM tokens WHERE id IN (SELECT value FROM json_each(?))`, jsonInts(ids))
	if err != nil {
		return nil, fmt.Errorf("store: tokens by id: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, err
		}
		out[t.ID] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: tokens by id: %w", err)
	}
	return out, nil
}

func jsonInts(ids []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte(']')
	return b.String()
}

func scanToken(r scanner) (Token, error) {
	var (
		t                 Token
		created           int64
		lastUsed, revoked sql.NullInt64
	)
	if err := r.Scan(&t.ID, &t.Account, &t.Name, &created, &lastUsed, &revoked); err != nil {
		return Token{}, fmt.Errorf("store: token: %w", err)
	}
	t.Created, t.LastUsed, t.Revoked = fromMS(created), fromNullMS(lastUsed), fromNullMS(revoked)
	return t, nil
}

func (s *sqliteStore) DeleteAccount(ctx context.Context, id int64) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var name string
		if err := tx.QueryRowContext(ctx, "SELECT name FROM accounts WHERE id = ?", id).Scan(&name); err != nil {
			return classify(err, fmt.Sprintf("account %d", id))
		}
		var sole string
		err := tx.QueryRowContext(ctx, `
			SELECT p.name FROM members m JOIN projects p ON p.id = m.project
			WHERE m.account = ? AND m.role = 'owner'
			AND NOT EXISTS (SELECT 1 FROM members o WHERE o.project = m.project AND o.role = 'owner' AND o.account <> m.account)
			ORDER BY p.id LIMIT 1`, id).Scan(&sole)
		switch {
		case err == nil:
			return fmt.Errorf("store: account %q is the only owner of project %q: %w", name, sole, ErrSoleOwner)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("store: delete account %d: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM accounts WHERE id = ?", id); err != nil {
			return fmt.Errorf("store: delete account %d: %w", id, err)
		}
		return nil
	})
}

func (s *sqliteStore) RevokeToken(ctx context.Context, id int64) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		var revoked sql.NullInt64
		if err := tx.QueryRowContext(ctx, "SELECT revoked_at FROM tokens WHERE id = ?", id).Scan(&revoked); err != nil {
			return classify(err, fmt.Sprintf("revoke token %d", id))
		}
		if revoked.Valid {
			return nil
		}
		if _, err := tx.ExecContext(ctx, "UPDATE tokens SET revoked_at = ? WHERE id = ?", ms(s.now()), id); err != nil {
			return fmt.Errorf("store: revoke token %d: %w", id, err)
		}
		return nil
	})
}

func (s *sqliteStore) ListTokens(ctx context.Context, account int64) ([]Token, error) {
	rows, err := s.r.QueryContext(ctx, `
		SELECT id, account, name, created_at, last_used_at, revoked_at
		FROM tokens WHERE account = ? OR ? = 0 ORDER BY id`, account, account)
	if err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	defer rows.Close()
	var out []Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	return out, nil
}

func strconvQuote(s string) string { return fmt.Sprintf("%q", s) }
