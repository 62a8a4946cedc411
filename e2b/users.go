package e2b

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/pkg/sftp"
)

// A call names the guest user it acts as (E2B's Authorization: Basic
// USER: on envd calls, ?username= on /files); den acts as root when it
// names none. Processes run as that user (setpriv, in its home unless a
// cwd is given, with its HOME, USER and LOGNAME); files and directories
// a call makes are that user's, and relative paths start from its home.
// Reads, lists, moves and removals go through den's agent as root: the
// user's permissions are not checked there.

// account is a guest user.
type account struct {
	name     string
	uid, gid int
	home     string
}

// rootAccount is who a call acts as when it names no user.
var rootAccount = account{name: "root", home: "/root"}

var userName = regexp.MustCompile(`^[a-z_][a-z0-9_.-]{0,31}$`)

// checkName refuses a user name a guest could not have.
func checkName(user string) error {
	if user != "" && !userName.MatchString(user) {
		return fmt.Errorf("bad user %q: a guest user name (lower case letters, digits, _ . -)", user)
	}
	return nil
}

// userOf is the user an envd call names in its Authorization header
// ("" for none).
func userOf(h http.Header) (string, error) {
	auth, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		return "", nil
	}
	raw, err := base64.StdEncoding.DecodeString(auth)
	if err != nil {
		return "", errors.New("bad Authorization header")
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user, checkName(user)
}

// lookupAccount finds user in the guest's /etc/passwd.
func lookupAccount(fs *sftp.Client, user string) (account, error) {
	if user == "" || user == "root" {
		return rootAccount, nil
	}
	f, err := fs.Open("/etc/passwd")
	if err != nil {
		return account{}, fmt.Errorf("reading the sandbox's /etc/passwd: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 6 || fields[0] != user {
			continue
		}
		uid, err1 := strconv.Atoi(fields[2])
		gid, err2 := strconv.Atoi(fields[3])
		if err1 != nil || err2 != nil {
			return account{}, fmt.Errorf("user %q has a bad /etc/passwd line", user)
		}
		return account{name: user, uid: uid, gid: gid, home: fields[5]}, nil
	}
	return account{}, fmt.Errorf("no user %q in the sandbox (useradd makes one)", user)
}

// abs is p as an absolute guest path: relative ones (and ~) start from
// the account's home.
func (a account) abs(p string) string {
	home := a.home
	if home == "" {
		home = "/"
	}
	if p == "" || p == "~" {
		return path.Clean(home)
	}
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		p = rest
	}
	if !path.IsAbs(p) {
		p = path.Join(home, p)
	}
	return path.Clean(p)
}

// own gives p to the account (nothing to do for root).
func (a account) own(fs *sftp.Client, p string) error {
	if a.uid == 0 && a.gid == 0 {
		return nil
	}
	return fs.Chown(p, a.uid, a.gid)
}

// mkdirAll makes dir and its missing parents, those it made owned by
// the account.
func (a account) mkdirAll(fs *sftp.Client, dir string) error {
	var missing []string
	for d := path.Clean(dir); d != "/" && d != "."; d = path.Dir(d) {
		if _, err := fs.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	if err := fs.MkdirAll(dir); err != nil {
		return err
	}
	for _, d := range missing {
		if err := a.own(fs, d); err != nil {
			return err
		}
	}
	return nil
}

// asUser is a shell command line that runs the rest of a line as user:
// in its home unless inHome is false, with its HOME, USER and LOGNAME.
// It execs, so the pid stays the process's.
func asUser(user string, inHome bool) string {
	cd := ""
	if inHome {
		cd = `cd "$h" || exit 1; `
	}
	return fmt.Sprintf(`u=%s; h=$(awk -F: -v u="$u" '$1 == u { print $6 }' /etc/passwd); `+
		`[ -n "$h" ] || { echo "den: no user $u in the sandbox (useradd makes one)" >&2; exit 1; }; `+
		`command -v setpriv >/dev/null || { echo "den: running as $u needs setpriv (util-linux) in the sandbox" >&2; exit 127; }; %s`+
		`exec setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups env HOME="$h" USER="$u" LOGNAME="$u" `, user, cd)
}
