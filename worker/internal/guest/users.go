package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// Session users are resolved by the init, inside the machine, against its
// own /etc/passwd and /etc/group: the machine's image says who its users
// are, and the worker, as host root, never reads a file a guest may have
// written. A user is "NAME" or "UID", optionally followed by ":GROUP" or
// ":GID" (an image config's syntax). A name must be in /etc/passwd (but
// root, uid 0, is root without an entry too); a
// numeric uid need not be (its group is then its passwd entry's primary
// group or, without one, the number itself). Supplementary groups are
// those of /etc/group that list the user's name. A uid or gid outside
// the machine's id mapping is refused.

// ErrUnknownUser reports a user or group that the machine does not know.
var ErrUnknownUser = errors.New("unknown user")

// maxIDFile bounds how much of /etc/passwd and /etc/group is read.
const maxIDFile = 4 << 20

// idEntry is one line of /etc/passwd or /etc/group.
type idEntry struct {
	name    string
	id      uint32
	gid     uint32   // passwd: primary group
	home    string   // passwd
	members []string // group
}

// readIDFile parses an /etc/passwd-style file: fields separated by ':',
// the name first and the id third. A missing file is empty. It refuses
// anything but a regular file (a FIFO would block the init).
func readIDFile(path string, group bool) ([]idEntry, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	var out []idEntry
	sc := bufio.NewScanner(io.LimitReader(f, maxIDFile))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < 3 || f[0] == "" {
			continue
		}
		id, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			continue
		}
		e := idEntry{name: f[0], id: uint32(id)}
		switch {
		case group && len(f) >= 4 && f[3] != "":
			e.members = strings.Split(f[3], ",")
		case !group && len(f) >= 4:
			if gid, err := strconv.ParseUint(f[3], 10, 32); err == nil {
				e.gid = uint32(gid)
			}
			if len(f) >= 6 {
				e.home = f[5]
			}
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// userDB is what resolving a user needs.
type userDB struct {
	passwd, group []idEntry
	// maxID is the largest mapped guest id.
	maxID uint32
}

// loadUserDB reads the machine's /etc/passwd and /etc/group.
func loadUserDB() (*userDB, error) {
	db := &userDB{maxID: mappedMax()}
	var err error
	if db.passwd, err = readIDFile("/etc/passwd", false); err != nil {
		return nil, err
	}
	if db.group, err = readIDFile("/etc/group", true); err != nil {
		return nil, err
	}
	return db, nil
}

// mappedMax returns the largest guest id of the machine's uid mapping
// (65535 if it cannot tell).
func mappedMax() uint32 {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return 65535
	}
	var top uint64
	for l := range strings.Lines(string(b)) {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		start, err1 := strconv.ParseUint(f[0], 10, 32)
		n, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 == nil && err2 == nil && n > 0 {
			top = max(top, start+n-1)
		}
	}
	if top == 0 || top > 1<<32-2 {
		return 65535
	}
	return uint32(top)
}

func numeric(s string) (uint32, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 32)
	return uint32(v), err == nil
}

// resolve resolves spec. A numeric uid without a passwd entry gets
// fallbackGID as its group if that is not negative, else the uid. Home is
// the passwd entry's, else /root for root and / for others.
func (db *userDB) resolve(spec string, fallbackGID int64) (*ctl.Cred, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	var pw *idEntry
	c := &ctl.Cred{}
	if uid, ok := numeric(userPart); ok {
		c.UID = uid
		if i := slices.IndexFunc(db.passwd, func(e idEntry) bool { return e.id == uid }); i >= 0 {
			pw = &db.passwd[i]
		}
	} else {
		i := slices.IndexFunc(db.passwd, func(e idEntry) bool { return e.name == userPart })
		switch {
		case i >= 0:
			pw = &db.passwd[i]
			c.UID = pw.id
		case userPart == "root":
			// uid 0 is root without a passwd entry too (an image
			// without /etc/passwd).
		default:
			return nil, fmt.Errorf("%w %q: not in the machine's /etc/passwd", ErrUnknownUser, userPart)
		}
	}
	switch {
	case pw != nil:
		c.GID = pw.gid
	case fallbackGID >= 0:
		c.GID = uint32(fallbackGID)
	default:
		c.GID = c.UID
	}
	if hasGroup {
		if gid, ok := numeric(groupPart); ok {
			c.GID = gid
		} else {
			i := slices.IndexFunc(db.group, func(e idEntry) bool { return e.name == groupPart })
			if i < 0 || groupPart == "" {
				return nil, fmt.Errorf("%w: group %q is not in the machine's /etc/group", ErrUnknownUser, groupPart)
			}
			c.GID = db.group[i].id
		}
	}
	if c.UID > db.maxID || c.GID > db.maxID {
		return nil, fmt.Errorf("%w %q: ids above %d are not mapped into the machine", ErrUnknownUser, spec, db.maxID)
	}
	if pw != nil && !hasGroup {
		for _, g := range db.group {
			if g.id != c.GID && g.id <= db.maxID && slices.Contains(g.members, pw.name) && !slices.Contains(c.Groups, g.id) {
				c.Groups = append(c.Groups, g.id)
			}
		}
	}
	switch {
	case pw != nil && pw.home != "":
		c.Home = pw.home
	case c.UID == 0:
		c.Home = "/root"
	default:
		c.Home = "/"
	}
	return c, nil
}
