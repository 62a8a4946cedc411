package users

import (
	"bytes"
	"crypto/rsa"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"
)

// MinRSABits is the smallest RSA key accepted.
const MinRSABits = 2048

// ParsedKey is a public key a user registers, as ParseAuthorizedKey
// checked it.
type ParsedKey struct {
	Key ssh.PublicKey
	// Fingerprint is ssh-keygen's SHA256 fingerprint ("SHA256:...").
	Fingerprint string
	// Comment is the key line's comment (often user@host).
	Comment string
	// Line is the key in authorized_keys form without the comment.
	Line string
}

// ParseAuthorizedKey parses one public key in authorized_keys / .pub form
// (the first key in data; blank and # lines are skipped). It refuses
// keys the gateway would not honour as written: authorized_keys options
// (command=, from=, restrict...), certificates, DSA and RSA keys shorter
// than MinRSABits, and private keys pasted by mistake.
func ParseAuthorizedKey(data []byte) (ParsedKey, error) {
	if bytes.Contains(data, []byte("PRIVATE KEY-----")) {
		return ParsedKey{}, errors.New("this is a private key: give the public one (the .pub file)")
	}
	pub, comment, opts, rest, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		return ParsedKey{}, errors.New("no ssh public key found (want a line like `ssh-ed25519 AAAA... comment`)")
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		if _, _, _, _, err := ssh.ParseAuthorizedKey(rest); err == nil {
			return ParsedKey{}, errors.New("more than one public key given: add them one at a time")
		}
	}
	if len(opts) > 0 {
		return ParsedKey{}, fmt.Errorf("key options are not supported by the gateway (%s): give the bare key", strings.Join(opts, ","))
	}
	if _, ok := pub.(*ssh.Certificate); ok {
		return ParsedKey{}, errors.New("certificates are not supported: give the plain public key")
	}
	switch pub.Type() {
	case ssh.KeyAlgoDSA:
		return ParsedKey{}, errors.New("dsa keys are not accepted: use ed25519 (ssh-keygen -t ed25519)")
	case ssh.KeyAlgoRSA:
		if ck, ok := pub.(ssh.CryptoPublicKey); ok {
			if rk, ok := ck.CryptoPublicKey().(*rsa.PublicKey); ok && rk.N.BitLen() < MinRSABits {
				return ParsedKey{}, fmt.Errorf("rsa key of %d bits is too short (minimum %d): use ed25519", rk.N.BitLen(), MinRSABits)
			}
		}
	}
	return ParsedKey{
		Key:         pub,
		Fingerprint: ssh.FingerprintSHA256(pub),
		Comment:     strings.TrimSpace(comment),
		Line:        strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))),
	}, nil
}
