package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

// Caller is who an API request comes from, as its connection proves it:
// the uid of a local process (SO_PEERCRED on the unix socket), the user
// of the key the SSH gateway verified, or the user of a bearer token on
// the TLS listener. Nothing the client says of itself counts.
type Caller struct {
	// User is the den user the request acts for.
	User string
	// Admin callers see and act on every user's VMs, checkpoints and
	// keys.
	Admin bool
	// Source says where the request came from, for the audit log:
	// "unix uid=1000", "ssh 192.0.2.1:50022", "tls 192.0.2.1:443 tok_ab12".
	Source string
	// Token is the id of the bearer token the request came with ("":
	// none); what it opens closes when it is revoked.
	Token string
}

// forUser refuses (403) a request field that names a user other than
// the caller, unless the caller is an admin: what a caller may not ask
// for is refused, never quietly replaced by what it may.
func forUser(r *http.Request, what, user string) error {
	c := callerOf(r)
	if c.Admin || user == "" || user == c.User {
		return nil
	}
	return fmt.Errorf("%s: only an admin acts for another user (%q; you are %q): %w", what, user, c.User, api.ErrForbidden)
}

// owner is the user whose VMs the caller may touch ("" for an admin:
// every VM).
func (c Caller) owner() string {
	if c.Admin {
		return ""
	}
	return c.User
}

type callerKey struct{}

// withCaller returns ctx carrying c.
func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// callerOf is the request's caller (the zero Caller, which may touch
// nothing but is no admin either, if none was established).
func callerOf(r *http.Request) Caller {
	c, _ := r.Context().Value(callerKey{}).(Caller)
	return c
}

// owner is the user a request acts for ("" for an admin: every VM).
func owner(r *http.Request) string { return callerOf(r).owner() }

// connCaller is a server-side connection whose caller is known when it
// is accepted: the SSH gateway's in-process connections.
type connCaller struct {
	net.Conn
	caller Caller
}

// errNoCaller is wrapped when a connection proves no caller.
var errNoCaller = errors.New("unauthenticated")

// Identities maps local uids onto den users: root and members of
// AdminGroup are admins; any other uid is the den user of its login
// name.
type Identities struct {
	// AdminGroup's members are admins ("" or a group that does not
	// exist: root only).
	AdminGroup string

	mu    sync.Mutex
	cache map[uint32]cachedCaller
}

// cachedCaller is a looked-up uid, kept for callerTTL: a user added to
// or removed from the admin group is seen within it.
type cachedCaller struct {
	c  Caller
	at time.Time
}

const callerTTL = time.Minute

// DefaultAdminGroup is the group whose members administer den.
const DefaultAdminGroup = "den-admin"

// ofUID is the caller a local uid is.
func (ids *Identities) ofUID(uid uint32) (Caller, error) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if e, ok := ids.cache[uid]; ok && time.Since(e.at) < callerTTL {
		return e.c, nil
	}
	c, err := ids.lookup(uid)
	if err != nil {
		return Caller{}, err
	}
	if ids.cache == nil || len(ids.cache) > 1024 {
		ids.cache = map[uint32]cachedCaller{}
	}
	ids.cache[uid] = cachedCaller{c: c, at: time.Now()}
	return c, nil
}

func (ids *Identities) lookup(uid uint32) (Caller, error) {
	src := "unix uid=" + strconv.FormatUint(uint64(uid), 10)
	if uid == 0 {
		return Caller{User: "root", Admin: true, Source: src}, nil
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return Caller{}, fmt.Errorf("uid %d has no user name: %w", uid, errNoCaller)
	}
	if err := validate.User(u.Username); err != nil {
		return Caller{}, fmt.Errorf("user %q of uid %d cannot be a den user: %w", u.Username, uid, errNoCaller)
	}
	c := Caller{User: u.Username, Source: src}
	if ids.AdminGroup != "" {
		if g, err := user.LookupGroup(ids.AdminGroup); err == nil {
			if gids, err := u.GroupIds(); err == nil && (slices.Contains(gids, g.Gid) || u.Gid == g.Gid) {
				c.Admin = true
			}
		}
	}
	return c, nil
}

// peerUID reads the uid of the process at the other end of a unix
// socket connection.
func peerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("not a unix socket connection: %w", errNoCaller)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred.Uid, nil
}

type connErrKey struct{}

// connContext establishes the caller of a new connection: the gateway's
// in-process connections carry theirs; a unix socket's is its peer's
// uid. Anything else (the TLS listener) is left to a bearer token.
func (ids *Identities) connContext(ctx context.Context, c net.Conn) context.Context {
	switch cc := c.(type) {
	case *connCaller:
		return withCaller(ctx, cc.caller)
	case *net.UnixConn:
		uid, err := peerUID(cc)
		if err == nil {
			var caller Caller
			if caller, err = ids.ofUID(uid); err == nil {
				return withCaller(ctx, caller)
			}
		}
		return context.WithValue(ctx, connErrKey{}, err)
	}
	return ctx
}
