package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/denhq/den/api"
	"github.com/denhq/den/audit"
	"github.com/denhq/den/internal/testutil"
)

// asCaller is a client whose connections are the given caller's, as the
// SSH gateway's are.
func (e *apiEnv) asCaller(c Caller) *api.Client {
	return api.NewDialClient("in-process", func(ctx context.Context) (net.Conn, error) { return e.inproc.dial(ctx, c) })
}

// overTLS is a client of the TLS listener with token, verifying the
// daemon's self-signed certificate.
func (e *apiEnv) overTLS(token string) *api.Client {
	e.t.Helper()
	pem, err := os.ReadFile(e.tlsLn.certFile)
	if err != nil {
		e.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c, err := api.NewRemoteClient("https://"+e.tlsLn.addr, token, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func names(vms []api.VM) string {
	var s []string
	for _, vm := range vms {
		s = append(s, vm.Name)
	}
	return strings.Join(s, ",")
}

// TestCallers: who calls is what the connection proves. Users see and
// touch only their own VMs, keys and tokens; admins see all; tokens on
// the TLS listener act as their user, and a wrong, revoked or malformed
// one is refused alike; every call lands in the audit log.
func TestCallers(t *testing.T) {
	e := newAPIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	alice := e.asCaller(Caller{User: "alice", Source: "test"})
	bob := e.asCaller(Caller{User: "bob", Source: "test"})
	admin := e.asCaller(Caller{User: "ops", Admin: true, Source: "test"})
	// A field only an admin may set is refused, not ignored.
	if _, err := alice.CreateVM(ctx, api.CreateRequest{Name: "abox", Owner: "bob", MemoryBytes: 128 << 20, DiskBytes: imageSize, IdleTimeout: "0", Cold: true}, nil); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("alice creates a vm for bob: %v; want forbidden", err)
	}
	if _, err := alice.AddKey(ctx, api.AddKeyRequest{User: "mallory", Name: "k", PublicKey: testutil.PublicKey(t)}); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("alice adds a key for mallory: %v; want forbidden", err)
	}
	if keys, err := admin.ListKeys(ctx); err != nil || len(keys) != 0 {
		t.Errorf("keys after the refusal: %+v %v", keys, err)
	}
	if _, err := alice.Audit(ctx, api.AuditQuery{User: "bob"}); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("alice reads bob's audit: %v; want forbidden", err)
	}
	if _, err := alice.CreateVM(ctx, api.CreateRequest{Name: "abox", Owner: "alice", MemoryBytes: 128 << 20, DiskBytes: imageSize, IdleTimeout: "0", Cold: true}, nil); err != nil {
		t.Fatal(err)
	}
	if vm, err := alice.GetVM(ctx, "abox"); err != nil || vm.Owner != "alice" {
		t.Fatalf("alice's vm: %+v %v", vm, err)
	}
	if _, err := bob.GetVM(ctx, "abox"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("bob reads alice's vm: %v", err)
	}
	if _, err := bob.Sleep(ctx, "abox", api.SleepRequest{}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("bob sleeps alice's vm: %v", err)
	}
	if vms, err := bob.ListVMs(ctx); err != nil || len(vms) != 0 {
		t.Errorf("bob's list: %q %v", names(vms), err)
	}
	if vms, err := admin.ListVMs(ctx); err != nil || names(vms) != "abox" {
		t.Errorf("the admin's list: %q %v", names(vms), err)
	}
	// e.client is root over the socket (SO_PEERCRED uid 0): an admin.
	if vms, err := e.client.ListVMs(ctx); err != nil || names(vms) != "abox" {
		t.Errorf("root's list: %q %v", names(vms), err)
	}

	// Tokens.
	if _, err := bob.AddToken(ctx, api.AddTokenRequest{Name: "x", Admin: true}); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("bob makes an admin token: %v", err)
	}
	if _, err := bob.AddToken(ctx, api.AddTokenRequest{Name: "x", User: "alice"}); !errors.Is(err, api.ErrForbidden) {
		t.Errorf("bob makes alice's token: %v", err)
	}
	at, err := alice.AddToken(ctx, api.AddTokenRequest{Name: "laptop"})
	if err != nil || !strings.HasPrefix(at.Secret, "den_") || at.User != "alice" {
		t.Fatalf("alice's token: %+v %v", at, err)
	}
	bt, err := bob.AddToken(ctx, api.AddTokenRequest{Name: "ci"})
	if err != nil {
		t.Fatal(err)
	}
	if vms, err := e.overTLS(at.Secret).ListVMs(ctx); err != nil || names(vms) != "abox" {
		t.Errorf("alice's token lists: %q %v", names(vms), err)
	}
	if _, err := e.overTLS(bt.Secret).GetVM(ctx, "abox"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("bob's token reads alice's vm: %v", err)
	}
	if ts, err := bob.ListTokens(ctx); err != nil || len(ts) != 1 || ts[0].Secret != "" {
		t.Errorf("bob's tokens: %+v %v", ts, err)
	}
	if _, err := bob.RemoveToken(ctx, at.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("bob revokes alice's token: %v", err)
	}
	wrong := at.Secret[:len(at.Secret)-2] + "AA"
	for _, tok := range []string{wrong, "den_short", "x"} {
		if _, err := e.overTLS(tok).ListVMs(ctx); !errors.Is(err, api.ErrUnauthenticated) {
			t.Errorf("token %.12q: %v; want unauthenticated", tok, err)
		}
	}
	if _, err := alice.RemoveToken(ctx, "laptop"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.overTLS(at.Secret).ListVMs(ctx); !errors.Is(err, api.ErrUnauthenticated) {
		t.Errorf("a revoked token: %v", err)
	}
	// The audit log: bob's calls, his refusals among them, and only his
	// for him.
	recs, err := e.srv.audit.Query(audit.Filter{User: "bob"})
	if err != nil || len(recs) == 0 {
		t.Fatalf("bob's audit records: %d %v", len(recs), err)
	}
	var sawRefusal bool
	for _, r := range recs {
		if r.User != "bob" {
			t.Errorf("bob's record of %q", r.User)
		}
		if r.VM == "abox" && r.Status == 404 {
			sawRefusal = true
		}
	}
	if !sawRefusal {
		t.Errorf("bob's refused read of abox is not in the audit log: %+v", recs)
	}
	mine, err := bob.Audit(ctx, api.AuditQuery{})
	if err != nil || len(mine) == 0 {
		t.Fatalf("bob's audit query: %d %v", len(mine), err)
	}
	for _, r := range mine {
		if r.User != "bob" {
			t.Fatalf("bob's audit query shows %q's record", r.User)
		}
	}
	all, err := admin.Audit(ctx, api.AuditQuery{VM: "abox"})
	if err != nil || len(all) < 3 {
		t.Fatalf("the admin's audit query: %d %v", len(all), err)
	}
}

// TestUIDs: root is an admin; a uid without a name is nobody den knows.
func TestUIDs(t *testing.T) {
	ids := &Identities{AdminGroup: "no-such-group-here"}
	if c, err := ids.ofUID(0); err != nil || !c.Admin || c.User != "root" {
		t.Fatalf("uid 0: %+v %v", c, err)
	}
	if c, err := ids.ofUID(4_000_000_123); err == nil || !strings.Contains(err.Error(), "has no user name") {
		t.Fatalf("a uid without a name: %+v %v", c, err)
	}
}
