// Package pgtest runs a real PostgreSQL (the machine's own) on a loopback
// port, or an address in a network namespace, for tests, and hands out a
// fresh database per test.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/denhq/den/internal/testutil"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Password is every test server's superuser password.
const Password = "den-pg-secret"

// Server is a PostgreSQL server running for tests.
type Server struct {
	// URL reaches the "postgres" database as the superuser, without the
	// password (Password).
	URL string
	// Port is the port the server listens on.
	Port int

	// ns and addr are the network namespace ("": the test's) and the
	// address the server listens on.
	ns, addr string

	base   string
	bindir string
	cmd    *exec.Cmd
	exited <-chan struct{}
	logf   *os.File
	dbs    atomic.Int64
}

// BinDir finds PostgreSQL's programs: DEN_PG_BINDIR, else Debian's.
func BinDir() (string, error) {
	dirs := []string{os.Getenv("DEN_PG_BINDIR")}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(m) > 0 {
		dirs = append(dirs, m[len(m)-1])
	}
	dirs = append(dirs, "/usr/local/bin")
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL not found (initdb): apt-get install postgresql, or set DEN_PG_BINDIR")
}

// Start starts a server that the test's cleanup stops.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartIn(t, "", "")
}

// StartIn is Start with the server in network namespace ns (a name from
// ip netns), listening on addr there: as a cluster's hosts in namespaces
// of their own reach it. Its unix socket (DSN) reaches it from any
// namespace.
func StartIn(t testing.TB, ns, addr string) *Server {
	t.Helper()
	s, err := start(ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

var shared struct {
	sync.Mutex
	s   *Server
	err error
}

// Shared returns the test binary's one server, started at its first use;
// TestMain stops it with StopShared.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.s == nil && shared.err == nil {
		shared.s, shared.err = start("", "")
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.s
}

// StopShared stops the server Shared started, if any.
func StopShared() {
	shared.Lock()
	defer shared.Unlock()
	if shared.s != nil {
		shared.s.Stop()
		shared.s = nil
	}
}

// DSN is the URL of database db with the password in it, through the
// server's unix socket: it reaches the server from network namespaces
// too, whose loopback may be down.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres:%s@/%s?host=%s&port=%d&sslmode=disable", Password, db, s.base, s.Port)
}

// TCPURL is the URL of database db over TCP, without the
// password (as a config file names it; the password goes in a secrets
// file).
func (s *Server) TCPURL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", net.JoinHostPort(s.addr, strconv.Itoa(s.Port)), db)
}

// NewDatabase creates an empty database of its own for the test, dropped
// when the test ends, and returns its URL with the password.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	return s.DSN(s.CreateDatabase(t, fmt.Sprintf("t%d_%d", os.Getpid(), s.dbs.Add(1))))
}

// CreateDatabase creates database name, dropped when the test ends, and
// returns its name.
func (s *Server) CreateDatabase(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create test database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return name
}

func (s *Server) exec(ctx context.Context, q string) error {
	db, err := sql.Open("pgx", s.DSN("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, q)
	return err
}

// Stop stops the server (SIGINT, then SIGKILL after 15 s) and removes
// its files.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.halt()
	s.cmd = nil
	s.logf.Close()
	os.RemoveAll(s.base)
}

// Restart stops the server and starts it again on the same port and
// data, as an operator's restart does; it returns once it answers.
func (s *Server) Restart() error {
	s.halt()
	return s.run()
}

// Down stops the server, as for a restart that Up completes.
func (s *Server) Down() { s.halt() }

// Crash stops the server at once, as a crash of it would: an immediate
// shutdown (SIGQUIT), its connections cut without a word to the statements
// in flight. Up starts it again, with crash recovery.
func (s *Server) Crash() { s.shutdown(syscall.SIGQUIT) }

// Up starts the server Down stopped; it returns once it answers.
func (s *Server) Up() error { return s.run() }

// halt stops the server process: a fast shutdown (SIGINT), then SIGKILL
// after 15 s.
func (s *Server) halt() { s.shutdown(syscall.SIGINT) }

// shutdown sends the server process sig, and SIGKILL if it has not exited
// 15 s later.
func (s *Server) shutdown(sig syscall.Signal) {
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

// Log returns what the server logged.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.base, "pg.log"))
	return string(b)
}

func start(ns, addr string) (*Server, error) {
	bindir, err := BinDir()
	if err != nil {
		return nil, err
	}
	base, err := os.MkdirTemp("", "den-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{base: base, bindir: bindir, ns: ns, addr: addr, Port: 5432}
	if err := s.init(); err != nil {
		os.RemoveAll(base)
		return nil, err
	}
	if ns == "" {
		// The test's own namespace: a free loopback port.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.RemoveAll(base)
			return nil, err
		}
		s.addr, s.Port = "127.0.0.1", l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	s.URL = s.TCPURL("postgres")
	if err := s.run(); err != nil {
		os.RemoveAll(base)
		return nil, err
	}
	return s, nil
}

// cred is the user PostgreSQL runs as: postgres when the test runs as
// root (PostgreSQL refuses root), else the test's own user.
func (s *Server) cred() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root and there is no postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (s *Server) command(name string, args ...string) (*exec.Cmd, error) {
	cred, err := s.cred()
	if err != nil {
		return nil, err
	}
	c := exec.Command(filepath.Join(s.bindir, name), args...)
	c.Dir = s.base
	c.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return c, nil
}

func (s *Server) init() error {
	cred, err := s.cred()
	if err != nil {
		return err
	}
	if err := os.Chmod(s.base, 0o755); err != nil {
		return err
	}
	pwfile := filepath.Join(s.base, "pw")
	if err := os.WriteFile(pwfile, []byte(Password+"\n"), 0o600); err != nil {
		return err
	}
	if cred != nil {
		for _, p := range []string{s.base, pwfile} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return err
			}
		}
	}
	c, err := s.command("initdb", "-D", filepath.Join(s.base, "data"), "-U", "postgres", "--auth=scram-sha-256", "--pwfile="+pwfile, "--no-sync")
	if err != nil {
		return err
	}
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if s.ns == "" {
		return nil
	}
	// In a namespace, clients come from the networks it is on, with the
	// password.
	hba, err := os.OpenFile(filepath.Join(s.base, "data", "pg_hba.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = hba.WriteString("host all all samenet scram-sha-256\n")
	return errors.Join(err, hba.Close())
}

func (s *Server) run() error {
	c, err := s.command("postgres", "-D", filepath.Join(s.base, "data"), "-k", s.base, "-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses="+s.addr, "-c", "fsync=off", "-c", "max_connections=300")
	if err != nil {
		return err
	}
	if s.logf == nil {
		if s.logf, err = os.OpenFile(filepath.Join(s.base, "pg.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return err
		}
	}
	c.Stdout, c.Stderr = s.logf, s.logf
	exited, err := testutil.StartLockedIn(s.ns, c)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd, s.exited = c, exited
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		err := s.exec(ctx, "SELECT 1")
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited at start:\n%s", s.Log())
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready after 60s: %v\n%s", err, lastLines(s.Log(), 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
