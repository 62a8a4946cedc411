package secrets

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// Use is one request for a secret, for the audit log and the VM's
// activity record: never its value.
type Use struct {
	VM, Owner, Secret string
	// Kind is the secret's: KindSSH, KindHTTPS.
	Kind string
	// Dest is, for an SSH secret, the destination's host key
	// fingerprint and the hosts that key is the secret's for; for an
	// HTTPS one, the request's method and URL and the answer's status.
	Dest string
	// Err is why it was refused or failed; nil: it signed, or the
	// request went out with the value.
	Err error
}

// sessionBind is OpenSSH's session-bind@openssh.com extension: the
// client tells its agent which server (host key) a session is with,
// signed by that server over the session's id.
const sessionBind = "session-bind@openssh.com"

// ServeSSHAgent serves the SSH agent protocol on rw for vm until rw
// ends: it lists the SSH secrets granted to vm, and signs with one only
// inside an SSH session the client has bound (session-bind, OpenSSH 8.9
// or later) to a host key the secret names, for that session's user
// authentication. Grants and values are read at every request, so a
// revoke or a new value counts at once. note hears of every signature
// asked for.
func (s *Store) ServeSSHAgent(rw io.ReadWriter, vm VMRef, note func(Use)) error {
	if note == nil {
		note = func(Use) {}
	}
	return agent.ServeAgent(&vmAgent{s: s, vm: vm, note: note}, rw)
}

// vmAgent is one agent connection of a VM.
type vmAgent struct {
	s    *Store
	vm   VMRef
	note func(Use)
	// bound is the host key the connection's session is bound to, and
	// session that session's id; forwarded says the agent was forwarded
	// on through a session (den's secrets are not).
	bound     ssh.PublicKey
	session   []byte
	forwarded bool
}

var _ agent.ExtendedAgent = (*vmAgent)(nil)

// granted are the SSH secrets granted to the VM, with their values.
func (a *vmAgent) granted() ([]record, error) { return a.s.granted(a.vm, KindSSH) }

func (a *vmAgent) List() ([]*agent.Key, error) {
	rs, err := a.granted()
	if err != nil {
		return nil, err
	}
	var keys []*agent.Key
	for _, r := range rs {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(r.PublicKey))
		if err != nil {
			continue
		}
		keys = append(keys, &agent.Key{Format: pub.Type(), Blob: pub.Marshal(), Comment: "den secret " + r.Name})
	}
	return keys, nil
}

func (a *vmAgent) Sign(key ssh.PublicKey, data []byte) (*ssh.Signature, error) {
	return a.SignWithFlags(key, data, 0)
}

func (a *vmAgent) SignWithFlags(key ssh.PublicKey, data []byte, flags agent.SignatureFlags) (*ssh.Signature, error) {
	rs, err := a.granted()
	if err != nil {
		return nil, err
	}
	blob := key.Marshal()
	rs = slices.DeleteFunc(rs, func(r record) bool {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(r.PublicKey))
		return err != nil || !bytes.Equal(pub.Marshal(), blob)
	})
	if len(rs) == 0 {
		return nil, errors.New("den: no secret granted to this vm has that key")
	}
	// Of secrets that share the key, one for the bound host decides.
	r := rs[0]
	if a.bound != nil {
		if i := slices.IndexFunc(rs, func(r record) bool { return r.hostKey(a.bound) }); i >= 0 {
			r = rs[i]
		}
	}
	use := Use{VM: a.vm.Name, Owner: r.Owner, Secret: r.Name, Kind: KindSSH}
	if a.bound != nil {
		use.Dest = ssh.FingerprintSHA256(a.bound) + " (" + strings.Join(r.hostsOf(a.bound), ",") + ")"
	}
	sig, err := a.sign(r, data, flags)
	use.Err = err
	a.note(use)
	return sig, err
}

func (a *vmAgent) sign(r record, data []byte, flags agent.SignatureFlags) (*ssh.Signature, error) {
	switch {
	case a.forwarded:
		return nil, fmt.Errorf("den: secret %q is not for a forwarded agent", r.Name)
	case a.bound == nil:
		return nil, fmt.Errorf("den: secret %q signs only in a session bound to its destination (OpenSSH 8.9 or later binds them)", r.Name)
	case !r.hostKey(a.bound):
		return nil, fmt.Errorf("den: secret %q is not for the host with key %s (it is for %s)", r.Name, ssh.FingerprintSHA256(a.bound), strings.Join(r.Hosts, ", "))
	}
	raw, err := ssh.ParseRawPrivateKey(r.Value)
	if err != nil {
		return nil, fmt.Errorf("den: secret %q: %w", r.Name, err)
	}
	signer, err := ssh.NewSignerFromKey(raw)
	if err != nil {
		return nil, fmt.Errorf("den: secret %q: %w", r.Name, err)
	}
	if !a.userauth(data, signer.PublicKey()) {
		return nil, fmt.Errorf("den: secret %q signs only the bound session's public key login", r.Name)
	}
	if as, ok := signer.(ssh.AlgorithmSigner); ok && signer.PublicKey().Type() == ssh.KeyAlgoRSA {
		switch {
		case flags&agent.SignatureFlagRsaSha512 != 0:
			return as.SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSASHA512)
		case flags&agent.SignatureFlagRsaSha256 != 0:
			return as.SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSASHA256)
		}
	}
	return signer.Sign(rand.Reader, data)
}

// userauth says whether data is the bound session's public key login
// with key (RFC 4252 section 7): string session id, byte
// SSH_MSG_USERAUTH_REQUEST, string user, string service
// "ssh-connection", string "publickey", TRUE, string algorithm, string
// the key, and nothing more.
func (a *vmAgent) userauth(data []byte, key ssh.PublicKey) bool {
	var m struct {
		Session []byte
		Type    byte
		User    string
		Service string
		Method  string
		Signed  bool
		Algo    string
		Key     []byte
		Rest    []byte `ssh:"rest"`
	}
	if ssh.Unmarshal(data, &m) != nil {
		return false
	}
	return bytes.Equal(m.Session, a.session) && m.Type == 50 && m.Service == "ssh-connection" && m.Method == "publickey" &&
		m.Signed && bytes.Equal(m.Key, key.Marshal()) && len(m.Rest) == 0
}

// hostKey says whether k is one of the secret's destinations' keys.
func (r record) hostKey(k ssh.PublicKey) bool {
	for _, hk := range r.HostKeys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(hk))
		if err == nil && bytes.Equal(pub.Marshal(), k.Marshal()) {
			return true
		}
	}
	return false
}

// hostsOf are the secret's hosts when k is one of its keys.
func (r record) hostsOf(k ssh.PublicKey) []string {
	if r.hostKey(k) {
		return r.Hosts
	}
	return nil
}

// Extension takes session-bind@openssh.com: the host key, the session
// id, the host's signature of it, and whether the agent is forwarded.
func (a *vmAgent) Extension(kind string, contents []byte) ([]byte, error) {
	if kind != sessionBind {
		return nil, agent.ErrExtensionUnsupported
	}
	var m struct {
		HostKey, SessionID, Signature []byte
		Forwarding                    bool
	}
	if err := ssh.Unmarshal(contents, &m); err != nil {
		return nil, fmt.Errorf("den: session-bind: %w", err)
	}
	hk, err := ssh.ParsePublicKey(m.HostKey)
	if err != nil {
		return nil, fmt.Errorf("den: session-bind: host key: %w", err)
	}
	var sig ssh.Signature
	if err := ssh.Unmarshal(m.Signature, &sig); err != nil {
		return nil, fmt.Errorf("den: session-bind: signature: %w", err)
	}
	if err := hk.Verify(m.SessionID, &sig); err != nil {
		return nil, fmt.Errorf("den: session-bind: the host's signature does not verify: %w", err)
	}
	if a.bound != nil && !m.Forwarding {
		// A second session on one agent connection: OpenSSH binds one.
		return nil, errors.New("den: session-bind: this connection is bound already")
	}
	a.forwarded = a.forwarded || m.Forwarding
	if a.bound == nil {
		a.bound, a.session = hk, m.SessionID
	}
	return nil, nil
}

var errReadOnly = errors.New("den: this agent's keys are den secrets: manage them with den secrets")

func (a *vmAgent) Add(agent.AddedKey) error       { return errReadOnly }
func (a *vmAgent) Remove(ssh.PublicKey) error     { return errReadOnly }
func (a *vmAgent) RemoveAll() error               { return errReadOnly }
func (a *vmAgent) Lock([]byte) error              { return errReadOnly }
func (a *vmAgent) Unlock([]byte) error            { return errReadOnly }
func (a *vmAgent) Signers() ([]ssh.Signer, error) { return nil, errReadOnly }
