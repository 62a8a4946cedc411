package storage

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// Config describes a volume. The zero value plus a StateDir is the embedded
// shape; setting MetaURL and S3 gives the shared shape. It is read from a
// JSON file (LoadConfig) or flags (RegisterFlags); secrets never appear in
// either: they come from SecretsFile.
type Config struct {
	// Name is the JuiceFS volume name (default "den").
	Name string `json:"name,omitempty"`
	// StateDir holds everything local: the embedded metadata and objects,
	// the cache, the mount log and (by default) the mount point.
	StateDir string `json:"state_dir"`
	// MountPoint is where the volume is mounted (default <StateDir>/mnt).
	MountPoint string `json:"mount_point,omitempty"`
	// MetaURL is the metadata engine: empty for the embedded
	// sqlite3://<StateDir>/meta.db, else redis://, rediss:// or
	// postgres:// (shared). It must not carry a password: put that in the
	// secrets file as meta_password.
	MetaURL string `json:"meta_url,omitempty"`
	// S3 is the object store; nil for the embedded files under
	// <StateDir>/objects/.
	S3 *S3Config `json:"s3,omitempty"`
	// CacheDir is the local read (and writeback) cache (default
	// <StateDir>/cache).
	CacheDir string `json:"cache_dir,omitempty"`
	// CacheSizeMiB bounds the cache (default: juicefs's, 100 GiB).
	CacheSizeMiB int64 `json:"cache_size_mib,omitempty"`
	// Writeback makes the mount acknowledge writes once they are in the
	// local cache and upload them later (see the package doc before
	// turning it on).
	Writeback bool `json:"writeback,omitempty"`
	// Shared says that other hosts mount the volume and write it too (a
	// cluster's): the mount keeps no metadata caches, so that what
	// another host wrote a moment ago shows at once here.
	Shared bool `json:"-"`
	// SecretsFile is a JSON file (mode 0600) with access_key, secret_key and
	// meta_password.
	SecretsFile string `json:"secrets_file,omitempty"`
	// JuiceFS is the juicefs binary (default: $DEN_JUICEFS, else juicefs
	// next to the running program, else in PATH).
	JuiceFS string `json:"juicefs,omitempty"`

	// Secrets are loaded from SecretsFile by LoadSecrets (or set by a
	// caller that has them from elsewhere); never serialized.
	Secrets Secrets `json:"-"`
}

// S3Config is an S3-compatible object store: MinIO or any S3.
type S3Config struct {
	// Endpoint is the URL of the service, e.g. http://127.0.0.1:9000.
	Endpoint string `json:"endpoint"`
	// Bucket is the bucket that holds the volume's chunks.
	Bucket string `json:"bucket"`
	// Region, where the service needs one (default us-east-1).
	Region string `json:"region,omitempty"`
	// CreateBucket makes the bucket at Open when it does not exist.
	CreateBucket bool `json:"create_bucket,omitempty"`
}

// Secrets are the credentials of a shared volume.
type Secrets struct {
	AccessKey    string `json:"access_key,omitempty"`
	SecretKey    string `json:"secret_key,omitempty"`
	MetaPassword string `json:"meta_password,omitempty"`
}

// Shape is the kind of volume a Config describes.
type Shape string

const (
	// Embedded keeps metadata and data on this host; nothing to run.
	Embedded Shape = "embedded"
	// Shared keeps data in S3 and metadata in a network database (with
	// sqlite3 metadata only this host can mount it).
	Shared Shape = "shared"
)

// Shape tells which shape c describes.
func (c *Config) Shape() Shape {
	if c.S3 != nil && *c.S3 != (S3Config{}) {
		return Shared
	}
	return Embedded
}

// LoadConfig reads a JSON config file and, if it names one, its secrets
// file. Relative paths in it are taken relative to the file's directory.
func LoadConfig(path string) (Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("load storage config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("load storage config %s: %w", path, err)
	}
	base := filepath.Dir(path)
	for _, p := range []*string{&c.StateDir, &c.MountPoint, &c.CacheDir, &c.SecretsFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(base, *p)
		}
	}
	if err := c.LoadSecrets(); err != nil {
		return c, err
	}
	return c, nil
}

// LoadSecrets reads c.SecretsFile into c.Secrets (nothing to do when it is
// empty). The file must not be readable by group or others.
func (c *Config) LoadSecrets() error {
	if c.SecretsFile == "" {
		return nil
	}
	f, err := os.Open(c.SecretsFile)
	if err != nil {
		return fmt.Errorf("load storage secrets: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("load storage secrets: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("load storage secrets %s: mode %04o lets others read it: chmod 600 %s",
			c.SecretsFile, st.Mode().Perm(), c.SecretsFile)
	}
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var s Secrets
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("load storage secrets %s: %w", c.SecretsFile, err)
	}
	c.Secrets = s
	return nil
}

// RegisterFlags binds the non-secret fields of c to flags on fs, named
// storage-*. Secrets have no flag on purpose: use -storage-secrets.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	if c.S3 == nil {
		c.S3 = &S3Config{}
	}
	fs.StringVar(&c.Name, "storage-name", c.Name, "JuiceFS volume name (default den)")
	fs.StringVar(&c.StateDir, "storage-state", c.StateDir, "local state directory of the volume")
	fs.StringVar(&c.MountPoint, "storage-mount", c.MountPoint, "mount point (default <state>/mnt)")
	fs.StringVar(&c.MetaURL, "storage-meta", c.MetaURL, "metadata URL: redis:// or postgres:// (default: embedded sqlite3)")
	fs.StringVar(&c.S3.Endpoint, "storage-s3-endpoint", c.S3.Endpoint, "S3 endpoint URL (default: embedded local files)")
	fs.StringVar(&c.S3.Bucket, "storage-s3-bucket", c.S3.Bucket, "S3 bucket")
	fs.StringVar(&c.S3.Region, "storage-s3-region", c.S3.Region, "S3 region")
	fs.BoolVar(&c.S3.CreateBucket, "storage-s3-create-bucket", c.S3.CreateBucket, "create the bucket if missing")
	fs.StringVar(&c.CacheDir, "storage-cache", c.CacheDir, "cache directory (default <state>/cache)")
	fs.BoolVar(&c.Writeback, "storage-writeback", c.Writeback, "acknowledge writes from the local cache (see docs)")
	fs.StringVar(&c.SecretsFile, "storage-secrets", c.SecretsFile, "JSON file (mode 0600) with access_key, secret_key, meta_password")
}

// normalize fills defaults and checks c; it returns a copy. A zero S3
// (flags registered, none given) counts as no S3.
func (c Config) normalize() (Config, error) {
	if c.S3 != nil && *c.S3 == (S3Config{}) {
		c.S3 = nil
	}
	if c.Name == "" {
		c.Name = "den"
	}
	if err := ValidName(c.Name); err != nil {
		return c, fmt.Errorf("storage config: volume %w", err)
	}
	if c.StateDir == "" {
		return c, errors.New("storage config: state_dir is required")
	}
	abs := func(p *string, def string) error {
		if *p == "" {
			*p = def
		}
		a, err := filepath.Abs(*p)
		*p = a
		return err
	}
	if err := abs(&c.StateDir, ""); err != nil {
		return c, fmt.Errorf("storage config: %w", err)
	}
	if err := abs(&c.MountPoint, filepath.Join(c.StateDir, "mnt")); err != nil {
		return c, fmt.Errorf("storage config: %w", err)
	}
	if err := abs(&c.CacheDir, filepath.Join(c.StateDir, "cache")); err != nil {
		return c, fmt.Errorf("storage config: %w", err)
	}
	if c.MetaURL != "" {
		u, err := url.Parse(c.MetaURL)
		if err != nil {
			return c, fmt.Errorf("storage config: meta_url: %w", err)
		}
		switch u.Scheme {
		case "redis", "rediss", "unix", "postgres", "postgresql", "sqlite3":
		default:
			return c, fmt.Errorf("storage config: meta_url scheme %q: use redis://, rediss://, postgres:// or sqlite3://", u.Scheme)
		}
		if _, ok := u.User.Password(); ok {
			return c, errors.New("storage config: meta_url carries a password: move it to the secrets file as meta_password")
		}
	}
	if c.S3 != nil {
		if c.S3.Endpoint == "" || c.S3.Bucket == "" {
			return c, errors.New("storage config: s3 needs endpoint and bucket")
		}
		u, err := url.Parse(c.S3.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, fmt.Errorf("storage config: s3 endpoint %q: want http(s)://host[:port]", c.S3.Endpoint)
		}
		if u.User != nil {
			return c, errors.New("storage config: s3 endpoint carries credentials: move them to the secrets file")
		}
		if c.Secrets.AccessKey == "" || c.Secrets.SecretKey == "" {
			return c, errors.New("storage config: s3 needs access_key and secret_key in the secrets file")
		}
		if c.S3.Region == "" {
			c.S3.Region = "us-east-1"
		}
	}
	if (c.S3 == nil) != (c.MetaURL == "") {
		if c.S3 == nil {
			return c, errors.New("storage config: meta_url is set but s3 is not: a shared volume needs both")
		}
		// S3 data with local metadata: valid, but only this host can mount it.
		c.MetaURL = "sqlite3://" + filepath.Join(c.StateDir, "meta.db")
	}
	return c, nil
}

// metaURL is the metadata URL handed to juicefs.
func (c *Config) metaURL() string {
	if c.MetaURL == "" {
		return "sqlite3://" + filepath.Join(c.StateDir, "meta.db")
	}
	u := c.MetaURL
	// juicefs inserts META_PASSWORD only into a URL that has a userinfo part.
	if c.Secrets.MetaPassword != "" && !strings.Contains(u, "@") {
		if i := strings.Index(u, "://"); i >= 0 {
			u = u[:i+3] + "@" + u[i+3:]
		}
	}
	return u
}

// env is the environment of every juicefs command: the secrets go here.
func (c *Config) env(format bool) []string {
	env := []string{}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "ACCESS_KEY", "SECRET_KEY", "SESSION_TOKEN", "META_PASSWORD", "META_PASSWORD_FILE", "REDIS_PASSWORD":
			continue
		}
		env = append(env, kv)
	}
	if c.Secrets.MetaPassword != "" {
		env = append(env, "META_PASSWORD="+c.Secrets.MetaPassword)
	}
	if format && c.S3 != nil {
		env = append(env, "ACCESS_KEY="+c.Secrets.AccessKey, "SECRET_KEY="+c.Secrets.SecretKey)
	}
	return env
}
