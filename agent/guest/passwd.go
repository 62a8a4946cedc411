//go:build linux

package guest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// account is a guest user as /etc/passwd and /etc/group describe it.
type account struct {
	Name   string
	UID    uint32
	GID    uint32
	Home   string
	Shell  string
	Groups []uint32
}

// lookupAccount finds name in etc/passwd. root is known even without a
// passwd file. The shell falls back to /bin/sh and the home to /.
func lookupAccount(etc, name string) (account, error) {
	if name == "" {
		name = "root"
	}
	a, found := account{}, false
	if f, err := os.Open(filepath.Join(etc, "passwd")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Split(sc.Text(), ":")
			if len(fs) < 7 || fs[0] != name {
				continue
			}
			uid, err1 := strconv.ParseUint(fs[2], 10, 32)
			gid, err2 := strconv.ParseUint(fs[3], 10, 32)
			if err1 != nil || err2 != nil {
				continue
			}
			a = account{Name: name, UID: uint32(uid), GID: uint32(gid), Home: fs[5], Shell: fs[6]}
			found = true
			break
		}
		f.Close()
	}
	if !found {
		if name != "root" {
			return account{}, fmt.Errorf("no user %q in %s", name, filepath.Join(etc, "passwd"))
		}
		a = account{Name: "root", Home: "/root"}
	}
	if st, err := os.Stat(a.Shell); a.Shell == "" || err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		a.Shell = "/bin/sh"
	}
	if st, err := os.Stat(a.Home); a.Home == "" || err != nil || !st.IsDir() {
		a.Home = "/"
	}
	if a.UID != 0 {
		a.Groups = supplementaryGroups(etc, name, a.GID)
	}
	return a, nil
}

func supplementaryGroups(etc, name string, primary uint32) []uint32 {
	gids := []uint32{primary}
	f, err := os.Open(filepath.Join(etc, "group"))
	if err != nil {
		return gids
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) < 4 {
			continue
		}
		gid, err := strconv.ParseUint(fs[2], 10, 32)
		if err != nil || uint32(gid) == primary {
			continue
		}
		for _, m := range strings.Split(fs[3], ",") {
			if m == name {
				gids = append(gids, uint32(gid))
				break
			}
		}
	}
	return gids
}
