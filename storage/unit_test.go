package storage

import (
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
)

func TestLayout(t *testing.T) {
	for p, want := range map[Path]string{
		ImageFile("debian", "rootfs.ext4"):     "images/debian/rootfs.ext4",
		VMDisk("box"):                          "vms/box/disk",
		CheckpointFile("box", "cp-3", "state"): "vms/box/checkpoints/cp-3/state",
		SuspendDir("box"):                      "vms/box/suspend",
		VMDir("box").Join("x", "y"):            "vms/box/x/y",
	} {
		if string(p) != want {
			t.Errorf("got %q, want %q", p, want)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if d := VMDisk("box").Dir(); d != VMDir("box") {
		t.Errorf("Dir: %q", d)
	}
	for _, bad := range []Path{"", "/abs", "vms/../etc", "vms//x", "vms/./x", "vms/.hidden", "vms/-x", VMDisk("a b")} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%q validated", bad)
		}
	}
	if _, err := hostPath("/mnt", Path("../x")); err == nil {
		t.Error("hostPath accepted ../x")
	}
}

func TestConfigShapes(t *testing.T) {
	dir := t.TempDir()
	c, err := Config{StateDir: dir}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if c.Shape() != Embedded || c.metaURL() != "sqlite3://"+dir+"/meta.db" || c.MountPoint != dir+"/mnt" || c.CacheDir != dir+"/cache" || c.Name != "den" {
		t.Fatalf("embedded defaults: %+v", c)
	}

	shared := Config{StateDir: dir, MetaURL: "redis://10.0.0.5:6379/1",
		S3:      &S3Config{Endpoint: "http://minio:9000", Bucket: "den"},
		Secrets: Secrets{AccessKey: "ak", SecretKey: "sk", MetaPassword: "pw"}}
	c, err = shared.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if c.Shape() != Shared || c.S3.Region != "us-east-1" {
		t.Fatalf("shared: %+v", c)
	}
	// META_PASSWORD is inserted by juicefs only where the URL has an '@'.
	if got := c.metaURL(); got != "redis://@10.0.0.5:6379/1" {
		t.Fatalf("meta url %q", got)
	}
	env := strings.Join(c.env(true), "\n")
	for _, kv := range []string{"META_PASSWORD=pw", "ACCESS_KEY=ak", "SECRET_KEY=sk"} {
		if !strings.Contains(env, kv) {
			t.Errorf("format env lacks %s", kv)
		}
	}
	if env := strings.Join(c.env(false), "\n"); strings.Contains(env, "SECRET_KEY=") {
		t.Error("mount env carries the S3 secret (only format needs it)")
	}

	for name, bad := range map[string]Config{
		"no state":          {},
		"password in url":   {StateDir: dir, MetaURL: "redis://:pw@h:6379/1", S3: shared.S3, Secrets: shared.Secrets},
		"meta without s3":   {StateDir: dir, MetaURL: "redis://h:6379/1"},
		"s3 without keys":   {StateDir: dir, S3: &S3Config{Endpoint: "http://h:9000", Bucket: "b"}},
		"endpoint no http":  {StateDir: dir, S3: &S3Config{Endpoint: "h:9000", Bucket: "b"}, Secrets: shared.Secrets},
		"unknown meta":      {StateDir: dir, MetaURL: "mongo://h", S3: shared.S3, Secrets: shared.Secrets},
		"bad name":          {StateDir: dir, Name: "a/b"},
		"keys in endpoint":  {StateDir: dir, S3: &S3Config{Endpoint: "http://ak:sk@h:9000", Bucket: "b"}, Secrets: shared.Secrets},
		"s3 without bucket": {StateDir: dir, S3: &S3Config{Endpoint: "http://h:9000"}, Secrets: shared.Secrets},
	} {
		if _, err := bad.normalize(); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "storage config: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// S3 data with local metadata: one host only, but valid.
	c, err = Config{StateDir: dir, S3: shared.S3, Secrets: shared.Secrets}.normalize()
	if err != nil || !strings.HasPrefix(c.metaURL(), "sqlite3://") {
		t.Fatalf("s3 + sqlite: %v %q", err, c.metaURL())
	}
}

func TestLoadConfigAndSecrets(t *testing.T) {
	dir := t.TempDir()
	sec := filepath.Join(dir, "secrets.json")
	os.WriteFile(sec, []byte(`{"access_key":"ak","secret_key":"sk","meta_password":"pw"}`), 0o644)
	conf := filepath.Join(dir, "storage.json")
	os.WriteFile(conf, []byte(`{"state_dir":"state","secrets_file":"secrets.json","meta_url":"postgres://den@db/den",
		"s3":{"endpoint":"http://minio:9000","bucket":"den"}}`), 0o644)
	if _, err := LoadConfig(conf); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable secrets file was accepted: %v", err)
	}
	os.Chmod(sec, 0o600)
	c, err := LoadConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != filepath.Join(dir, "state") || c.Secrets != (Secrets{"ak", "sk", "pw"}) || c.Shape() != Shared {
		t.Fatalf("%+v", c)
	}
	os.WriteFile(conf, []byte(`{"state_dir":"s","secret_key":"oops"}`), 0o644)
	if _, err := LoadConfig(conf); err == nil {
		t.Fatal("an unknown field (a secret in the config file) was accepted")
	}

	var fc Config
	fs := flag.NewFlagSet("den", flag.ContinueOnError)
	fc.RegisterFlags(fs)
	if err := fs.Parse([]string{"-storage-state", dir}); err != nil {
		t.Fatal(err)
	}
	if c, err := fc.normalize(); err != nil || c.Shape() != Embedded {
		t.Fatalf("flags without s3: %v %+v", err, c)
	}
	if fs.Lookup("storage-s3-secret-key") != nil {
		t.Fatal("a secret has a flag")
	}
}

func TestParseInfoData(t *testing.T) {
	out := []byte(`/mnt/vms/box/disk :
  inode: 2
  files: 1
   dirs: 0
 length: 256.00 MiB (268435456 Bytes)
   size: 256.00 MiB (268435456 Bytes)
   path: /vms/box/disk
 chunks:
+------------+---------+---------+--------+----------+
| chunkIndex | sliceId |    size | offset |   length |
+------------+---------+---------+--------+----------+
|          0 |       5 | 4194304 |      0 |  4194304 |
|          0 |       0 |       0 |      0 | 60914688 |
|          1 |       6 | 4194304 |      0 |  4194304 |
+------------+---------+---------+--------+----------+
`)
	n, err := parseInfoData(out)
	if err != nil || n != 8<<20 {
		t.Fatalf("got %d, %v", n, err)
	}
	if n, err := parseInfoData([]byte("/f :\n  inode: 3\n")); err != nil || n != 0 {
		t.Fatalf("empty file: %d %v", n, err)
	}
	// Several files in one call: a table each, each with its header.
	if n, err := parseInfoData(append(append([]byte{}, out...), out...)); err != nil || n != 16<<20 {
		t.Fatalf("two files: %d %v", n, err)
	}
}

func TestLastLines(t *testing.T) {
	got := lastLines("2026/11/21 08:00:54.928714 juicefs[32638] <INFO>: Mounting volume den [mountMain@mount_unix.go:1155]\n\n"+
		"2026/11/21 08:00:55.1 juicefs[1] <FATAL>: load setting: database is not formatted [main@main.go:1]\n", 2)
	if got != "Mounting volume den; load setting: database is not formatted" {
		t.Fatalf("%q", got)
	}
}

func TestS3ErrorMessages(t *testing.T) {
	s3 := S3Config{Endpoint: "http://127.0.0.1:9000", Bucket: "den"}
	for code, want := range map[string]string{
		"InvalidAccessKeyId":         "access key rejected",
		"SignatureDoesNotMatch":      "secret key rejected",
		"NoSuchBucket":               `bucket "den" does not exist`,
		"AccessDenied":               "permission denied: grant these keys list, read, write and delete",
		"XMinioServerNotInitialized": "server not ready",
	} {
		err := s3Error(s3, "write object", minio.ErrorResponse{Code: code, Message: "m"})
		if !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "s3 den at http://127.0.0.1:9000: ") {
			t.Errorf("%s: %v", code, err)
		}
	}
	err := s3Error(s3, "list bucket", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
	if !strings.Contains(err.Error(), "endpoint unreachable") {
		t.Errorf("dial: %v", err)
	}
	err = s3Error(s3, "list bucket", &net.DNSError{Name: "minio.invalid", Err: "no such host"})
	if !strings.Contains(err.Error(), `host "minio.invalid" not found`) {
		t.Errorf("dns: %v", err)
	}
}
