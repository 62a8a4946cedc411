// Package secrets keeps den's secrets encrypted at rest, records which
// VMs may use which, and signs with SSH secrets for the VMs granted them,
// only for the destinations each secret names: the values never enter a
// VM.
package secrets

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"filippo.io/age"
	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/internal/validate"
)

// KindSSH is an SSH private key: VMs granted it sign with it through
// their SSH agent socket, for its destinations' host keys only.
const KindSSH = "ssh"

// Errors callers tell apart.
var (
	ErrNotFound = errors.New("no such secret")
	ErrExists   = errors.New("secret exists")
	ErrInvalid  = validate.ErrInvalid
)

// maxValue bounds a secret's value, maxHosts its known_hosts lines.
const (
	maxValue = 64 << 10
	maxHosts = 64 << 10
)

// Secret is what den says of a secret: never its value.
type Secret struct {
	Name  string `json:"name"`
	Owner string `json:"owner"`
	Kind  string `json:"kind"`
	// Hosts are the destinations, as their known_hosts lines name them.
	Hosts []string `json:"hosts"`
	// HostKeys are the destinations' host keys (authorized_keys form):
	// a signature is made only inside an SSH session bound to one of them.
	HostKeys []string `json:"host_keys,omitempty"`
	// PublicKey is the SSH key's public half (authorized_keys form), to
	// give to the destination.
	PublicKey string `json:"public_key,omitempty"`
	// Header and Query name where an HTTPS secret goes: the request
	// header, or the query parameter, whose placeholder den replaces.
	Header string `json:"header,omitempty"`
	Query  string `json:"query,omitempty"`
	// Env is the environment variable that holds an HTTPS secret's
	// placeholder in the VMs granted it.
	Env     string    `json:"env,omitempty"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
}

// record is a secret as its file holds it, encrypted.
type record struct {
	Secret
	Value []byte `json:"value"`
}

// VMRef names one VM for a grant: its name and when it was made, so that
// a later VM of the same name, or a fork, gets nothing.
type VMRef struct {
	Name    string
	Created time.Time
}

// Grant lets a VM use a secret.
type Grant struct {
	VM      string `json:"vm"`
	Created int64  `json:"vm_created_ms"`
	Owner   string `json:"owner"`
	Secret  string `json:"secret"`
}

func (g Grant) of(vm VMRef) bool { return g.VM == vm.Name && g.Created == vm.Created.UnixMilli() }

// Store is the secrets of one den host in a directory: one file per
// secret, encrypted with age to an identity kept in its own file, and
// the grants.
type Store struct {
	dir string
	id  *age.X25519Identity
	mu  sync.Mutex // writes, and grants.json's read-modify-write
	// https says the store may hold an HTTPS secret (AnyHTTPS): found at
	// Open, set by AddHTTPS, found again by Remove.
	https atomic.Bool
}

// Open opens the store in dir, with the age identity in keyFile (made,
// readable by its owner only, if missing).
func Open(dir, keyFile string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open secrets: %w", err)
	}
	b, err := os.ReadFile(keyFile)
	if errors.Is(err, fs.ErrNotExist) {
		if users, _ := os.ReadDir(filepath.Join(dir, "users")); len(users) > 0 {
			return nil, fmt.Errorf("open secrets: the key %s is missing, and %s holds secrets only it opens: put it back (den makes a new key only for an empty store)", keyFile, dir)
		}
		id, gerr := age.GenerateX25519Identity()
		if gerr != nil {
			return nil, fmt.Errorf("open secrets: %w", gerr)
		}
		if err := os.MkdirAll(filepath.Dir(keyFile), 0o700); err != nil {
			return nil, fmt.Errorf("open secrets: %w", err)
		}
		if err := atomicfile.Write(keyFile, []byte(id.String()+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("open secrets: %w", err)
		}
		return &Store{dir: dir, id: id}, nil // a new store: empty
	}
	if err != nil {
		return nil, fmt.Errorf("open secrets: %w", err)
	}
	id, err := age.ParseX25519Identity(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("open secrets: key %s: %w", keyFile, err)
	}
	st := &Store{dir: dir, id: id}
	st.https.Store(st.holdsHTTPS())
	return st, nil
}

func (s *Store) path(owner, name string) string {
	return filepath.Join(s.dir, "users", owner, name+".age")
}

func check(owner, name string) error {
	if err := validate.User(owner); err != nil {
		return err
	}
	return validate.SecretName(name)
}

// AddSSH stores a new SSH secret: key is an unencrypted private key
// (OpenSSH or PEM), knownHosts the known_hosts lines of its destinations.
func (s *Store) AddSSH(owner, name string, key []byte, knownHosts string) (Secret, error) {
	if err := check(owner, name); err != nil {
		return Secret{}, err
	}
	pub, err := sshPublic(key)
	if err != nil {
		return Secret{}, fmt.Errorf("secret %q: %w", name, err)
	}
	if len(knownHosts) > maxHosts {
		return Secret{}, fmt.Errorf("secret %q: known_hosts of %d KiB at most: %w", name, maxHosts>>10, ErrInvalid)
	}
	hosts, keys, err := parseKnownHosts(knownHosts)
	if err != nil {
		return Secret{}, fmt.Errorf("secret %q: %w", name, err)
	}
	now := time.Now().UTC()
	r := record{Secret: Secret{Name: name, Owner: owner, Kind: KindSSH, Hosts: hosts, HostKeys: keys, PublicKey: pub,
		Created: now, Updated: now}, Value: key}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(s.path(owner, name)); err == nil {
		return Secret{}, fmt.Errorf("secret %q: %w (den secrets set changes its value)", name, ErrExists)
	}
	return r.Secret, s.write(r)
}

// Set replaces a secret's value; VMs granted it sign with the new one
// from their next request on.
func (s *Store) Set(owner, name string, value []byte) (Secret, error) {
	if err := check(owner, name); err != nil {
		return Secret{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.read(owner, name)
	if err != nil {
		return Secret{}, err
	}
	switch r.Kind {
	case KindSSH:
		if r.PublicKey, err = sshPublic(value); err != nil {
			return Secret{}, fmt.Errorf("secret %q: %w", name, err)
		}
	case KindHTTPS:
		value = oneLine(value)
		if err := headerValue(value); err != nil {
			return Secret{}, fmt.Errorf("secret %q: %w", name, err)
		}
	}
	r.Value, r.Updated = value, time.Now().UTC()
	return r.Secret, s.write(r)
}

// Get is a secret, without its value.
func (s *Store) Get(owner, name string) (Secret, error) {
	if err := check(owner, name); err != nil {
		return Secret{}, err
	}
	r, err := s.read(owner, name)
	return r.Secret, err
}

// List is owner's secrets by name ("": everyone's).
func (s *Store) List(owner string) ([]Secret, error) {
	var out []Secret
	users, err := os.ReadDir(filepath.Join(s.dir, "users"))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	for _, u := range users {
		if owner != "" && u.Name() != owner {
			continue
		}
		files, err := os.ReadDir(filepath.Join(s.dir, "users", u.Name()))
		if err != nil {
			return nil, fmt.Errorf("list secrets: %w", err)
		}
		for _, f := range files {
			name, ok := strings.CutSuffix(f.Name(), ".age")
			if !ok || strings.HasPrefix(name, ".") {
				continue
			}
			r, err := s.read(u.Name(), name)
			if err != nil {
				return nil, err
			}
			out = append(out, r.Secret)
		}
	}
	slices.SortFunc(out, func(a, b Secret) int { return strings.Compare(a.Owner+"/"+a.Name, b.Owner+"/"+b.Name) })
	return out, nil
}

// Remove deletes a secret and its grants.
func (s *Store) Remove(owner, name string) error {
	if err := check(owner, name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Not decrypted: a secret that cannot be read any more can go.
	if _, err := os.Stat(s.path(owner, name)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("secret %q of %s: %w", name, owner, ErrNotFound)
	}
	if _, err := s.dropGrants(func(g Grant) bool { return g.Owner == owner && g.Secret == name }); err != nil {
		return err
	}
	if err := os.Remove(s.path(owner, name)); err != nil {
		return fmt.Errorf("remove secret %q: %w", name, err)
	}
	s.https.Store(s.holdsHTTPS())
	return nil
}

// Grant lets vm use owner's secret name, from its next request on.
func (s *Store) Grant(owner, name string, vm VMRef) error {
	if err := check(owner, name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.read(owner, name); err != nil {
		return err
	}
	return s.addGrants(Grant{VM: vm.Name, Created: vm.Created.UnixMilli(), Owner: owner, Secret: name})
}

// Revoke takes a grant back, at once: vm's next request is refused. It
// says whether there was one.
func (s *Store) Revoke(owner, name string, vm VMRef) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropGrants(func(g Grant) bool { return g.of(vm) && g.Owner == owner && g.Secret == name })
}

// Grants are vm's grants.
func (s *Store) Grants(vm VMRef) ([]Grant, error) {
	gs, err := s.grants()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(gs, func(g Grant) bool { return !g.of(vm) }), nil
}

// CopyGrants gives to the grants from has of owner's secrets (den fork
// --with-secrets).
func (s *Store) CopyGrants(from, to VMRef, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	gs, err := s.Grants(from)
	if err != nil {
		return err
	}
	gs = slices.DeleteFunc(gs, func(g Grant) bool { return g.Owner != owner })
	for i := range gs {
		gs[i].VM, gs[i].Created = to.Name, to.Created.UnixMilli()
	}
	return s.addGrants(gs...)
}

// ForgetVM drops a removed VM's grants and its CA.
func (s *Store) ForgetVM(vm VMRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.dropGrants(func(g Grant) bool { return g.of(vm) })
	return errors.Join(err, s.forgetCA(vm))
}

// addGrants records grants not recorded yet (s.mu held).
func (s *Store) addGrants(add ...Grant) error {
	gs, err := s.grants()
	if err != nil {
		return err
	}
	n := len(gs)
	for _, g := range add {
		if !slices.Contains(gs, g) {
			gs = append(gs, g)
		}
	}
	if len(gs) == n {
		return nil
	}
	return s.writeGrants(gs)
}

// dropGrants removes the grants drop picks, and says whether there were
// any (s.mu held).
func (s *Store) dropGrants(drop func(Grant) bool) (bool, error) {
	gs, err := s.grants()
	if err != nil {
		return false, err
	}
	n := len(gs)
	if gs = slices.DeleteFunc(gs, drop); len(gs) == n {
		return false, nil
	}
	return true, s.writeGrants(gs)
}

func (s *Store) grantsPath() string { return filepath.Join(s.dir, "grants.json") }

func (s *Store) grants() ([]Grant, error) {
	b, err := os.ReadFile(s.grantsPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read secret grants: %w", err)
	}
	var gs []Grant
	if err := json.Unmarshal(b, &gs); err != nil {
		return nil, fmt.Errorf("read secret grants %s: %w", s.grantsPath(), err)
	}
	return gs, nil
}

func (s *Store) writeGrants(gs []Grant) error {
	if gs == nil {
		gs = []Grant{}
	}
	if err := atomicfile.WriteJSON(s.grantsPath(), gs, 0o600); err != nil {
		return fmt.Errorf("write secret grants: %w", err)
	}
	return nil
}

// granted are the secrets of a kind granted to vm, with their values
// (one that cannot be read is left out: it does not stop the others).
func (s *Store) granted(vm VMRef, kind string) ([]record, error) {
	gs, err := s.Grants(vm)
	if err != nil {
		return nil, err
	}
	var out []record
	for _, g := range gs {
		if r, err := s.read(g.Owner, g.Secret); err == nil && r.Kind == kind {
			out = append(out, r)
		}
	}
	return out, nil
}

// read decrypts one secret's file.
func (s *Store) read(owner, name string) (record, error) {
	f, err := os.Open(s.path(owner, name))
	if errors.Is(err, fs.ErrNotExist) {
		return record{}, fmt.Errorf("secret %q of %s: %w", name, owner, ErrNotFound)
	}
	if err != nil {
		return record{}, fmt.Errorf("read secret %q: %w", name, err)
	}
	defer f.Close()
	d, err := age.Decrypt(f, s.id)
	if err != nil {
		return record{}, fmt.Errorf("decrypt secret %q: %w", name, err)
	}
	var r record
	if err := json.NewDecoder(io.LimitReader(d, 4*(maxValue+maxHosts))).Decode(&r); err != nil {
		return record{}, fmt.Errorf("decrypt secret %q: %w", name, err)
	}
	return r, nil
}

// write encrypts one secret's file, atomically.
func (s *Store) write(r record) error {
	if len(r.Value) == 0 || len(r.Value) > maxValue {
		return fmt.Errorf("secret %q: a value of 1 byte to %d KiB: %w", r.Name, maxValue>>10, ErrInvalid)
	}
	plain, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	w, err := age.Encrypt(&buf, s.id.Recipient())
	if err != nil {
		return fmt.Errorf("encrypt secret %q: %w", r.Name, err)
	}
	if _, err := w.Write(plain); err != nil {
		return fmt.Errorf("encrypt secret %q: %w", r.Name, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("encrypt secret %q: %w", r.Name, err)
	}
	p := s.path(r.Owner, r.Name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("write secret %q: %w", r.Name, err)
	}
	if err := atomicfile.Write(p, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("write secret %q: %w", r.Name, err)
	}
	return nil
}

// sshPublic checks an SSH private key and returns its public half.
func sshPublic(key []byte) (string, error) {
	raw, err := ssh.ParseRawPrivateKey(key)
	var pp *ssh.PassphraseMissingError
	if errors.As(err, &pp) {
		return "", fmt.Errorf("the SSH key has a passphrase: give den the key without one (ssh-keygen -p -N '' -f COPY): %w", ErrInvalid)
	}
	if err != nil {
		return "", fmt.Errorf("not an SSH private key: %v: %w", err, ErrInvalid)
	}
	signer, err := ssh.NewSignerFromKey(raw)
	if err != nil {
		return "", fmt.Errorf("SSH key: %v: %w", err, ErrInvalid)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))), nil
}

// parseKnownHosts reads known_hosts lines: the hosts they name and their
// keys. It needs at least one.
func parseKnownHosts(text string) (hosts, keys []string, err error) {
	rest := []byte(text)
	for len(bytes.TrimSpace(rest)) > 0 {
		var marker string
		var names []string
		var key ssh.PublicKey
		marker, names, key, _, rest, err = ssh.ParseKnownHosts(rest)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("known_hosts: %v: %w", err, ErrInvalid)
		}
		if marker != "" {
			return nil, nil, fmt.Errorf("known_hosts: a line marked @%s: give plain host keys: %w", marker, ErrInvalid)
		}
		for _, n := range names {
			if !slices.Contains(hosts, n) {
				hosts = append(hosts, n)
			}
		}
		k := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, nil, fmt.Errorf("give the destinations' host keys as known_hosts lines (ssh-keyscan HOST): %w", ErrInvalid)
	}
	return hosts, keys, nil
}
