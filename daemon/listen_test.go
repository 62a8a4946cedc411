package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/denhq/den/machine"
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

// TestE2BCertificate: a non-loopback E2B listener's self-signed
// certificate holds its sandboxes' host names (PORT-ID.DOMAIN) and the
// listener's address, is kept while it does, and is made anew for a
// domain it lacks; the API's certificate is not touched.
func TestE2BCertificate(t *testing.T) {
	state := machine.StateDir(t.TempDir())
	o := Options{E2BListen: "192.0.2.7:3000"}
	leaf := func(cfg *tls.Config) *x509.Certificate {
		t.Helper()
		c, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg, err := e2bTLS(o, state, "sbx.example.test:3000")
	if err != nil {
		t.Fatal(err)
	}
	c := leaf(cfg)
	for _, name := range []string{"8000-abc123.sbx.example.test", "sbx.example.test", "192.0.2.7", "localhost"} {
		if err := c.VerifyHostname(name); err != nil {
			t.Errorf("the certificate is not valid for %s: %v", name, err)
		}
	}
	if c.VerifyHostname("a.b.sbx.example.test") == nil {
		t.Error("the certificate is valid two labels below the domain")
	}
	cfg, err = e2bTLS(o, state, "sbx.example.test")
	if err != nil {
		t.Fatal(err)
	}
	if again := leaf(cfg); !again.Equal(c) {
		t.Error("a certificate that holds the names was made anew")
	}
	cfg, err = e2bTLS(o, state, "other.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf(cfg).VerifyHostname("8000-abc123.other.test"); err != nil {
		t.Errorf("a new domain: %v", err)
	}
	// Another address: a new certificate for it.
	o.E2BListen = "192.0.2.8:3000"
	if cfg, err = e2bTLS(o, state, "other.test"); err != nil {
		t.Fatal(err)
	}
	if err := leaf(cfg).VerifyHostname("192.0.2.8"); err != nil {
		t.Errorf("a new address: %v", err)
	}
	if _, err := os.Stat(state.APICert()); !os.IsNotExist(err) {
		t.Errorf("the API's certificate file: %v", err)
	}
}
