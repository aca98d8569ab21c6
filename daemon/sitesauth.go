package daemon

import (
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
