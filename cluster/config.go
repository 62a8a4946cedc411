// Package cluster describes how a den daemon joins the other hosts of a
// cluster: one PostgreSQL registry and one shared JuiceFS volume.
package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/storage"
)

// DefaultLease is how long a host's heartbeat keeps it alive and its
// leases held.
const DefaultLease = 10 * time.Second

// MinLease is the shortest lease a cluster may use: a host renews every
// tenth of it.
const MinLease = 3 * time.Second

// Config is a cluster config file (JSON):
//
//	{
//	  "host": "host-a",
//	  "address": "10.0.0.1:8443",
//	  "ca_cert": "cluster-ca.crt", "ca_key": "cluster-ca.key",
//	  "registry": "postgres://den@db.example:5432/den?sslmode=require",
//	  "secrets_file": "cluster-secrets.json",
//	  "volume": {"meta_url": "postgres://den@db.example:5432/den_volume", "s3": {...}, "secrets_file": "volume-secrets.json"},
//	  "lease": "10s"
//	}
type Config struct {
	// Host is this host's name in the cluster (default: the machine's
	// hostname).
	Host string `json:"host,omitempty"`
	// Address is where the other hosts reach this one (host:port): its
	// peer listener, over mutual TLS with CACert's certificates. Without
	// it, requests are not forwarded between hosts.
	Address string `json:"address,omitempty"`
	// CACert and CAKey (PEM files; the key mode 0600) are the cluster's
	// CA, shared by its hosts: each host signs itself a certificate
	// with it at start.
	CACert string `json:"ca_cert,omitempty"`
	CAKey  string `json:"ca_key,omitempty"`
	// Registry is the PostgreSQL URL of den's shared record, without a
	// password (registry_password in the secrets file).
	Registry string `json:"registry"`
	// SecretsFile is a JSON file (mode 0600) with registry_password.
	SecretsFile string `json:"secrets_file,omitempty"`
	// Volume is the shared volume: data in S3, metadata in PostgreSQL
	// (a database of its own). Its state_dir defaults to the daemon's.
	Volume storage.Config `json:"volume"`
	// Lease is how long a heartbeat keeps the host alive (default 10s).
	Lease Duration `json:"lease,omitempty"`

	// RegistryPassword is loaded from SecretsFile; never serialized.
	RegistryPassword string `json:"-"`
}

// Duration is a time.Duration written as "10s" in JSON.
type Duration time.Duration

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

type secrets struct {
	RegistryPassword string `json:"registry_password"`
}

// Load reads a cluster config file and the secrets files it names
// (relative paths are taken from the file's directory), and checks it:
// hostName is the default host name, volumeState the default state_dir
// of the volume.
func Load(path, hostName, volumeState string) (Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("cluster config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("cluster config %s: %w", path, err)
	}
	base := filepath.Dir(path)
	for _, p := range []*string{&c.SecretsFile, &c.CACert, &c.CAKey, &c.Volume.StateDir, &c.Volume.MountPoint, &c.Volume.CacheDir, &c.Volume.SecretsFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(base, *p)
		}
	}
	c.Volume.Shared = true
	if c.Volume.StateDir == "" {
		c.Volume.StateDir = volumeState
	}
	if c.Host == "" {
		c.Host = hostName
	}
	if c.Lease == 0 {
		c.Lease = Duration(DefaultLease)
	}
	if c.SecretsFile != "" {
		var s secrets
		if err := readSecrets(c.SecretsFile, &s); err != nil {
			return c, err
		}
		c.RegistryPassword = s.RegistryPassword
	}
	if err := c.Volume.LoadSecrets(); err != nil {
		return c, fmt.Errorf("cluster config: volume: %w", err)
	}
	if err := c.Check(); err != nil {
		return c, err
	}
	return c, nil
}

func readSecrets(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cluster secrets: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cluster secrets: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("cluster secrets %s: mode %04o lets others read it: chmod 600 %s", path, st.Mode().Perm(), path)
	}
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("cluster secrets %s: %w", path, err)
	}
	return nil
}

// Check refuses a config den cannot run a cluster on: a bad host name or
// address, a registry that is not PostgreSQL, or a volume only this host
// can mount.
func (c Config) Check() error {
	if err := validate.HostName(c.Host); err != nil {
		return fmt.Errorf("cluster config: host: %w", err)
	}
	if c.Address != "" {
		if _, _, err := net.SplitHostPort(c.Address); err != nil {
			return fmt.Errorf("cluster config: address %s: want host:port", validate.Quote(c.Address))
		}
	}
	if (c.Address != "") != (c.CACert != "" && c.CAKey != "") {
		return errors.New("cluster config: address, ca_cert and ca_key go together: hosts reach each other only over mutual TLS with the cluster's CA")
	}
	if time.Duration(c.Lease) < MinLease {
		return fmt.Errorf("cluster config: lease %s is shorter than %s", time.Duration(c.Lease), MinLease)
	}
	reg, err := postgresURL("registry", c.Registry)
	if err != nil {
		return err
	}
	if c.Volume.S3 == nil || c.Volume.S3.Endpoint == "" {
		return errors.New("cluster config: the volume keeps its data on this host: a cluster's volume needs s3 (MinIO or any S3) that every host reaches")
	}
	if c.Volume.MetaURL == "" || strings.HasPrefix(c.Volume.MetaURL, "sqlite3:") {
		return errors.New("cluster config: the volume keeps its metadata on this host: a cluster's volume needs meta_url, a PostgreSQL database every host reaches")
	}
	if c.Volume.Writeback {
		return errors.New("cluster config: the volume's writeback keeps acknowledged writes in this host's cache: a host that dies loses them to the host that takes over; turn writeback off")
	}
	meta, err := postgresURL("volume meta_url", c.Volume.MetaURL)
	if err != nil {
		return err
	}
	if meta.Host == reg.Host && strings.Trim(meta.Path, "/") == strings.Trim(reg.Path, "/") {
		return fmt.Errorf("cluster config: the volume's metadata and den's registry are both database %q: give the volume a database of its own", strings.Trim(reg.Path, "/"))
	}
	return nil
}

func postgresURL(what, s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || strings.Trim(u.Path, "/") == "" {
		return nil, fmt.Errorf("cluster config: %s %s: want postgres://USER@HOST[:PORT]/DATABASE", what, validate.Quote(s))
	}
	if _, ok := u.User.Password(); ok {
		return nil, fmt.Errorf("cluster config: %s carries a password: put it in the secrets file", what)
	}
	return u, nil
}

// RegistryDSN is the registry's URL with its password.
func (c Config) RegistryDSN() string {
	if c.RegistryPassword == "" {
		return c.Registry
	}
	u, err := url.Parse(c.Registry)
	if err != nil {
		return c.Registry
	}
	name := "postgres"
	if u.User != nil {
		name = u.User.Username()
	}
	u.User = url.UserPassword(name, c.RegistryPassword)
	return u.String()
}
