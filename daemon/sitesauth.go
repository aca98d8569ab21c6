package daemon

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/store"
)

// Browser access to a site on its own origin (AppOptions.Sites.Domain):
// a member asks the API for a signed URL, the browser opens it, and the
// gateway exchanges its token for a signed cookie of that site's origin.
// Both are the same kind of value, told apart by their purpose:
//
//	base64url(PURPOSE|SITE|PROJECT|ACCOUNT|TOKEN|EXPIRES) "." base64url(HMAC-SHA256)
//
// where TOKEN is the id of the bearer token the URL was minted with and
// EXPIRES a Unix time. The key is the daemon's (SitesKeyFile in the state
// directory). A value verifies only for its purpose and its site, until it
// expires, and authorizes only while the bearer token is live and the
// account a member of the site's project: both are checked on every
// request, so revoking the token or removing the member ends a cookie's
// access at once.

// SitesKeyFile is the file of the state directory holding the key signed
// site URLs and cookies are made with: 32 random bytes, mode 0600, created
// on first use. Deleting it (daemon stopped) invalidates every signed URL
// and cookie.
const SitesKeyFile = "sites.key"

// SiteTokenParam is the query parameter of a signed site URL.
const SiteTokenParam = "corral-site-token"

// Site cookie names: with https the __Host- prefix, which browsers accept
// only Secure, with Path=/ and without Domain (host-only).
const (
	siteCookie       = "corral-site"
	siteCookieSecure = "__Host-corral-site"
)

const (
	purposeURL    = "u"
	purposeCookie = "c"
	macContext    = "corral-site-v1|"
)

// siteClaims is what a signed value says.
type siteClaims struct {
	purpose string
	site    string
	project int64
	account int64
	token   int64
	expires time.Time
}

// errBadSiteCredential is a signed value that is malformed, tampered with,
// expired, or for another purpose or site: 403.
var errBadSiteCredential = errors.New("daemon: sites: bad credential")

// siteKey is the daemon's signing key, loaded or created on first use.
type siteKey struct {
	path string // empty: an ephemeral key of this process
	mu   sync.Mutex
	key  []byte
}

func (k *siteKey) get() ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key != nil {
		return k.key, nil
	}
	if k.path == "" {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("daemon: sites key: %w", err)
		}
		k.key = b
		return b, nil
	}
	b, err := loadOrCreateKey(k.path)
	if err != nil {
		return nil, err
	}
	k.key = b
	return b, nil
}

// loadOrCreateKey reads the key at path, creating it (0600, exclusively,
// so that two daemons racing agree) if missing. A key readable by others
// than its owner, or of the wrong size, is refused.
func loadOrCreateKey(path string) ([]byte, error) {
	for range 3 {
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			b := make([]byte, 32)
			if _, err := rand.Read(b); err != nil {
				return nil, fmt.Errorf("daemon: sites key: %w", err)
			}
			tmp, err := os.CreateTemp(filepath.Dir(path), ".sites.key-*")
			if err != nil {
				return nil, fmt.Errorf("daemon: sites key: %w", err)
			}
			_, werr := tmp.Write(b)
			serr := tmp.Sync()
			cerr := tmp.Close()
			if err := errors.Join(werr, serr, cerr); err != nil {
				os.Remove(tmp.Name())
				return nil, fmt.Errorf("daemon: sites key: %w", err)
			}
			// CreateTemp made it 0600; link fails if another daemon won.
			err = os.Link(tmp.Name(), path)
			os.Remove(tmp.Name())
			if err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("daemon: sites key: %w", err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("daemon: sites key: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("daemon: sites key: %w", err)
		}
		if st.Mode().Perm()&0o077 != 0 || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("daemon: sites key %s has mode %v; want a regular file of mode 0600", path, st.Mode())
		}
		b := make([]byte, 33)
		n, _ := f.Read(b)
		if n != 32 {
			return nil, fmt.Errorf("daemon: sites key %s: want 32 bytes", path)
		}
		return b[:32], nil
	}
	return nil, fmt.Errorf("daemon: sites key %s: could not create it", path)
}

func (c siteClaims) payload() string {
	return strings.Join([]string{c.purpose, c.site, strconv.FormatInt(c.project, 10), strconv.FormatInt(c.account, 10),
		strconv.FormatInt(c.token, 10), strconv.FormatInt(c.expires.Unix(), 10)}, "|")
}

func mac(key []byte, payload string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(macContext))
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// sign returns the signed value of c.
func (k *siteKey) sign(c siteClaims) (string, error) {
	key, err := k.get()
	if err != nil {
		return "", err
	}
	p := c.payload()
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(p)) + "." + enc.EncodeToString(mac(key, p)), nil
}

// verify checks v's signature, purpose, site and expiry at now.
func (k *siteKey) verify(v, purpose, site string, now time.Time) (siteClaims, error) {
	key, err := k.get()
	if err != nil {
		return siteClaims{}, err
	}
	enc := base64.RawURLEncoding
	ps, ms, ok := strings.Cut(v, ".")
	if !ok || len(v) > 512 {
		return siteClaims{}, errBadSiteCredential
	}
	p, err1 := enc.DecodeString(ps)
	sum, err2 := enc.DecodeString(ms)
	if err1 != nil || err2 != nil || !hmac.Equal(sum, mac(key, string(p))) {
		return siteClaims{}, errBadSiteCredential
	}
	f := strings.Split(string(p), "|")
	if len(f) != 6 {
		return siteClaims{}, errBadSiteCredential
	}
	c := siteClaims{purpose: f[0], site: f[1]}
	var nums [4]int64
	for i, s := range f[2:] {
		if nums[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return siteClaims{}, errBadSiteCredential
		}
	}
	c.project, c.account, c.token, c.expires = nums[0], nums[1], nums[2], time.Unix(nums[3], 0)
	if c.purpose != purpose || c.site != site || !now.Before(c.expires) {
		return siteClaims{}, errBadSiteCredential
	}
	return c, nil
}

// siteConns tracks every request the Sites gateway is proxying (plain
// requests, streamed responses and upgraded WebSocket connections alike),
// by the bearer token and account that authorized it. Cancelling one ends
// its request context, which makes the reverse proxy close both sides of
// an upgraded connection.
//
// It is the one place site connections are closed from: by the recheck
// loop (a revoked token, a removed member) and by whoever else ends a
// token's or an account's access (closeToken, closeAccount).
type siteConns struct {
	mu    sync.Mutex
	conns map[*siteConn]struct{}
}

type siteConn struct {
	token, account, project int64
	cancel                  context.CancelCauseFunc
}

// errSiteAccessEnded is the cause of a cancelled site connection.
var errSiteAccessEnded = errors.New("daemon: sites: access ended")

// add tracks a request; call done when it ends.
func (s *siteConns) add(ctx context.Context, token, account, project int64) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &siteConn{token: token, account: account, project: project, cancel: cancel}
	s.mu.Lock()
	if s.conns == nil {
		s.conns = make(map[*siteConn]struct{})
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		cancel(nil)
	}
}

// closeWhere cancels the tracked connections match selects, with cause
// reason, and returns how many.
func (s *siteConns) closeWhere(match func(*siteConn) bool, reason string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if match(c) {
			c.cancel(fmt.Errorf("%w: %s", errSiteAccessEnded, reason))
			delete(s.conns, c)
			n++
		}
	}
	return n
}

// closeToken closes the site connections bearer token id authorized.
func (s *siteConns) closeToken(id int64, reason string) int {
	return s.closeWhere(func(c *siteConn) bool { return c.token == id }, reason)
}

// closeAccount closes the site connections of account id.
func (s *siteConns) closeAccount(id int64, reason string) int {
	return s.closeWhere(func(c *siteConn) bool { return c.account == id }, reason)
}

// count returns the number of tracked connections.
func (s *siteConns) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// recheck closes the connections whose token was revoked or whose account
// is no longer a member of the site's project.
func (s *siteConns) recheck(ctx context.Context, st store.Store) {
	type member struct{ project, account int64 }
	s.mu.Lock()
	tokens := map[int64]bool{}
	members := map[member]bool{}
	for c := range s.conns {
		tokens[c.token] = true
		members[member{c.project, c.account}] = true
	}
	s.mu.Unlock()
	for id := range tokens {
		if _, err := st.LiveToken(ctx, id); errors.Is(err, store.ErrNotFound) {
			s.closeToken(id, "the token was revoked")
		}
	}
	for m := range members {
		if _, err := st.GetMember(ctx, m.project, m.account); errors.Is(err, store.ErrNotFound) {
			s.closeWhere(func(c *siteConn) bool { return c.project == m.project && c.account == m.account }, "no longer a member of the project")
		}
	}
}

// run rechecks every interval until ctx ends.
func (s *siteConns) run(ctx context.Context, st store.Store, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.recheck(ctx, st)
		}
	}
}
