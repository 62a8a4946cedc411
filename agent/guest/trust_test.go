//go:build linux

package guest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/agent"
)

// testCA is a self-signed CA certificate (PEM) named cn, of organization org.
func testCA(t *testing.T, org, cn string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: []string{org}},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestTrustCA: den's CA joins the system bundle and a file of its own,
// in place of an earlier one of den's (a fork's source's); the bundle's
// other certificates stay; without a bundle the file alone is written;
// what is not a CA of den's is refused.
func TestTrustCA(t *testing.T) {
	root := t.TempDir()
	other1, other2 := testCA(t, "Example", "Root One"), testCA(t, "Example", "Root Two")
	parent, mine := testCA(t, "den", "den vm box secrets CA"), testCA(t, "den", "den vm twin secrets CA")
	bundle := filepath.Join(root, caBundle)
	writeFile(t, bundle, other1+parent+other2)
	file, err := trustCA(root, []byte(mine))
	if err != nil || file != "/"+caFile {
		t.Fatalf("trustCA: %q %v", file, err)
	}
	got, _ := os.ReadFile(bundle)
	if string(got) != other1+other2+mine {
		t.Fatalf("the bundle:\n%s", got)
	}
	if b, _ := os.ReadFile(filepath.Join(root, caFile)); string(b) != mine {
		t.Fatalf("the ca file: %q", b)
	}
	if _, err := trustCA(root, []byte(mine)); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(bundle); string(again) != string(got) {
		t.Fatal("installing the same ca again changed the bundle")
	}
	if _, err := trustCA(root, []byte(other1)); err == nil {
		t.Fatal("a ca not den's was taken")
	}
	bare := t.TempDir()
	if _, err := trustCA(bare, []byte(mine)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bare, caBundle)); err == nil {
		t.Fatal("a bundle was made where there was none")
	}
}

// TestSecretsEnv: sessions get the placeholders den sent last, and
// NODE_EXTRA_CA_CERTS with a CA; bad variables are refused.
func TestSecretsEnv(t *testing.T) {
	h := newHarness(t)
	root := t.TempDir()
	h.sys.TrustCA = func(pem []byte) (string, error) { return trustCA(root, pem) }
	c := h.dial()
	defer c.Close()
	ca := testCA(t, "den", "den vm box secrets CA")
	reply, err := c.SetSecrets(testCtx(t), agent.SecretsRequest{Env: []string{"API_TOKEN=den-secret:api"}, CA: ca})
	if err != nil || reply.CAFile != "/"+caFile {
		t.Fatalf("SetSecrets: %+v %v", reply, err)
	}
	_, out, _ := run(t, c, agent.ExecRequest{CmdLine: "echo $API_TOKEN $NODE_EXTRA_CA_CERTS"})
	if strings.TrimSpace(out) != "den-secret:api /"+caFile {
		t.Fatalf("a session's environment: %q", out)
	}
	if _, err := c.SetSecrets(testCtx(t), agent.SecretsRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := run(t, c, agent.ExecRequest{CmdLine: "echo x${API_TOKEN}x"}); strings.TrimSpace(out) != "xx" {
		t.Fatalf("after a revoke: %q", out)
	}
	for _, bad := range []string{"API=the-value", "1X=den-secret:a", "PATH=den-secret:a b"} {
		if _, err := c.SetSecrets(testCtx(t), agent.SecretsRequest{Env: []string{bad}}); err == nil {
			t.Errorf("%q was taken", bad)
		}
	}
}
