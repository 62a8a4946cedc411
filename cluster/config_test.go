package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, dir, name, data string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoad: a cluster config with its secrets files loads, relative paths
// taken from its directory; the registry URL gets its password only in
// RegistryDSN.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "cs.json", `{"registry_password": "p@ss/word"}`, 0o600)
	write(t, dir, "vs.json", `{"access_key": "ak", "secret_key": "sk", "meta_password": "mp"}`, 0o600)
	p := write(t, dir, "c.json", `{"registry": "postgres://den@db:5432/den?sslmode=require", "secrets_file": "cs.json",
		"address": "10.0.0.1:8443", "ca_cert": "ca.crt", "ca_key": "/etc/den/ca.key",
		"volume": {"meta_url": "postgres://den@db:5432/den_volume", "s3": {"endpoint": "http://s3:9000", "bucket": "b"}, "secrets_file": "vs.json"}}`, 0o600)
	c, err := Load(p, "host-a", "/var/lib/den/juicefs")
	if err != nil {
		t.Fatal(err)
	}
	if c.Host != "host-a" || time.Duration(c.Lease) != DefaultLease || c.Volume.StateDir != "/var/lib/den/juicefs" ||
		c.Volume.Secrets.AccessKey != "ak" || c.RegistryPassword != "p@ss/word" || c.CACert != filepath.Join(dir, "ca.crt") || c.CAKey != "/etc/den/ca.key" {
		t.Fatalf("loaded %+v", c)
	}
	if dsn := c.RegistryDSN(); !strings.Contains(dsn, "den:p%40ss%2Fword@db:5432/den") || !strings.Contains(dsn, "sslmode=require") {
		t.Fatalf("registry dsn %s", dsn)
	}
}

// TestCheck: configs den cannot run a cluster on are refused, each with
// what to change.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "vs.json", `{"access_key": "ak", "secret_key": "sk"}`, 0o600)
	loose := write(t, dir, "loose.json", `{"registry_password": "x"}`, 0o644)
	good := `"volume": {"meta_url": "postgres://den@db/den_volume", "s3": {"endpoint": "http://s3:9000", "bucket": "b"}, "secrets_file": "vs.json"}`
	for _, tc := range []struct{ cfg, want string }{
		{`{"registry": "postgres://den@db/den", "volume": {}}`, "the volume keeps its data on this host"},
		{`{"registry": "postgres://den@db/den", "volume": {"s3": {"endpoint": "http://s3:9000", "bucket": "b"}, "secrets_file": "vs.json"}}`, "keeps its metadata on this host"},
		{`{"registry": "postgres://den@db/den", "volume": {"meta_url": "postgres://den@db/den", "s3": {"endpoint": "http://s3:9000", "bucket": "b"}, "secrets_file": "vs.json"}}`, "give the volume a database of its own"},
		{`{"registry": "mysql://den@db/den", ` + good + `}`, "want postgres://"},
		{`{"registry": "postgres://den@db", ` + good + `}`, "want postgres://"},
		{`{"registry": "postgres://den:pw@db/den", ` + good + `}`, "carries a password"},
		{`{"host": "bad host", "registry": "postgres://den@db/den", ` + good + `}`, "bad host name"},
		{`{"address": "nowhere", "ca_cert": "c", "ca_key": "k", "registry": "postgres://den@db/den", ` + good + `}`, "want host:port"},
		{`{"address": "10.0.0.1:8443", "registry": "postgres://den@db/den", ` + good + `}`, "only over mutual TLS"},
		{`{"ca_cert": "c", "ca_key": "k", "registry": "postgres://den@db/den", ` + good + `}`, "go together"},
		{`{"lease": "1s", "registry": "postgres://den@db/den", ` + good + `}`, "shorter than"},
		{`{"lease": "soon", "registry": "postgres://den@db/den", ` + good + `}`, "invalid duration"},
		{`{"registry": "postgres://den@db/den", "extra": 1, ` + good + `}`, "unknown field"},
		{`{"registry": "postgres://den@db/den", "volume": {"meta_url": "postgres://den@db/den_volume", "writeback": true, "s3": {"endpoint": "http://s3:9000", "bucket": "b"}, "secrets_file": "vs.json"}}`, "turn writeback off"},
		{`{"registry": "postgres://den@db/den", "secrets_file": "` + loose + `", ` + good + `}`, "lets others read it"},
	} {
		p := write(t, dir, "c.json", tc.cfg, 0o600)
		if _, err := Load(p, "h", "/s"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
