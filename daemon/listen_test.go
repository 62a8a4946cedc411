package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenUnixDirectory: the socket is opened to every local user
// after it is made, so it is made only in a directory where no one else
// may replace it (with a link, in between): one only the daemon may
// write to, or a sticky one such as /tmp. There it is 0666, and a second
// daemon on it is refused.
func TestListenUnixDirectory(t *testing.T) {
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	if ln, err := listenUnix(filepath.Join(shared, "den.sock")); err == nil {
		ln.Close()
		t.Fatal("a socket in a directory others may write to was made")
	} else if !strings.Contains(err.Error(), "writable by it alone") {
		t.Fatalf("refusal: %v", err)
	}
	if err := os.Chmod(shared, 0o777|os.ModeSticky); err != nil { // as /tmp
		t.Fatal(err)
	}
	ln, err := listenUnix(filepath.Join(shared, "den.sock"))
	if err != nil {
		t.Fatalf("a socket in a sticky directory: %v", err)
	}
	ln.Close()

	path := filepath.Join(dir, "own", "den.sock")
	ln, err = listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode: %v %v", st.Mode(), err)
	}
	if ln2, err := listenUnix(path); err == nil {
		ln2.Close()
		t.Fatal("a second daemon took over the socket")
	}
}
