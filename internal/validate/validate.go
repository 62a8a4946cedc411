// Package validate holds den's rules, in one place, for every input that
// names something (a VM, a user, an image, a checkpoint, a key, a token) and the
// length limits of every free string a client sends. The CLI, the API,
// the SSH gateway and the registry all check with these functions, so a
// value one of them takes, the others take too. Every error wraps
// ErrInvalid and quotes the value at most QuoteMax bytes long: a value of
// 64 KiB is never echoed back or logged whole.
package validate

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrInvalid is wrapped by every error of this package; machine.ErrInvalid
// and users.ErrInvalid are the same error.
var ErrInvalid = errors.New("invalid")

// Limits: the longest value each input may be, in bytes. docs/api.md
// ("Limits") lists them.
const (
	MaxVMName       = 63      // a DNS label
	MaxUser         = 64      // user names (VM owners, key users)
	MaxImage        = 64      // image names
	MaxCheckpointID = 24      // cp-N
	MaxComment      = 4 << 10 // a checkpoint's comment
	MaxKeyName      = 128     // a key's name (default: its comment)
	MaxPublicKey    = 16 << 10
	MaxKeyRef       = 128         // a key's fingerprint or name, to remove it
	MaxTokenName    = 64          // an API token's name
	MaxTokenRef     = 64          // an API token's id or name, to remove it
	MaxDuration     = 64          // a duration such as an idle timeout
	MaxHostName     = 64          // a cluster host's name
	MaxGuestPath    = 4095        // a file's path in a guest (Linux's PATH_MAX, its NUL excluded)
	MaxEnvEntry     = 128<<10 - 1 // KEY=VALUE for a guest command (one argument: agent.MaxCommandLine)
	// QuoteMax bounds how much of a refused value an error quotes.
	QuoteMax = 64
)

// Quote is %q of s, cut to QuoteMax bytes ("..." and the length
// follow a value cut short).
func Quote(s string) string {
	if len(s) <= QuoteMax {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:QuoteMax]), len(s))
}

var (
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	userRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._@-]{0,63}$`)
	imageRE  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$`)
	cpRE     = regexp.MustCompile(`^cp-[1-9][0-9]{0,19}$`)
	tokIDRE  = regexp.MustCompile(`^tok_[0-9a-f]{8}$`)
	tokRE    = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._@-]{0,63}$`)
	hostRE   = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9.-]{0,62}[a-zA-Z0-9])?$`)
	secretRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_.-]{0,63}$`)
)

// SecretName checks a secret's name: 1 to 64 letters, digits, '_', '.'
// and '-', starting with a letter.
func SecretName(name string) error {
	if !secretRE.MatchString(name) {
		return fmt.Errorf("bad secret name %s: use 1-64 letters, digits, '_', '.' and '-', starting with a letter: %w", Quote(name), ErrInvalid)
	}
	return nil
}

// reserved VM names mean something else to the SSH gateway ("den"), or
// to den's CLI ("help": every verb takes it as a subcommand).
var reserved = map[string]bool{"den": true, "help": true}

// VMName checks a VM name: a DNS label, 1 to 63 lower-case letters,
// digits and hyphens, not starting or ending with a hyphen. VM names
// become hostnames and SSH user names; "den" and "help" are reserved.
func VMName(name string) error {
	if !dnsLabel.MatchString(name) {
		return fmt.Errorf("bad vm name %s: use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit: %w", Quote(name), ErrInvalid)
	}
	if reserved[name] {
		return fmt.Errorf("vm name %q is reserved (ssh den@host runs den verbs; den VERB help shows help): %w", name, ErrInvalid)
	}
	return nil
}

// User checks a user name (a VM's owner, a key's user): 1 to 64 letters,
// digits, '.', '_', '@' or '-', starting with a letter or digit.
func User(user string) error {
	if !userRE.MatchString(user) {
		return fmt.Errorf("bad user name %s: use letters, digits, '.', '_', '@' or '-' (at most %d), starting with a letter or digit: %w", Quote(user), MaxUser, ErrInvalid)
	}
	return nil
}

// Image checks the form of an image name: 1 to 64 letters, digits, '.',
// '_' or '-', starting with a letter or digit (never a path). Whether
// the image exists is the image directory's to say (machine: not found).
func Image(name string) error {
	if !imageRE.MatchString(name) {
		return fmt.Errorf("bad image name %s: use 1-%d letters, digits, '.', '_' or '-' (e.g. debian, minimal): %w", Quote(name), MaxImage, ErrInvalid)
	}
	return nil
}

// HostName checks a host's name in a cluster: 1 to 64 letters, digits,
// '.' and '-', starting and ending with a letter or digit (a hostname).
func HostName(name string) error {
	if !hostRE.MatchString(name) {
		return fmt.Errorf("bad host name %s: use 1-%d letters, digits, '.' and '-', starting and ending with a letter or digit: %w", Quote(name), MaxHostName, ErrInvalid)
	}
	return nil
}

// CheckpointID checks a checkpoint id: cp-N.
func CheckpointID(id string) error {
	if len(id) > MaxCheckpointID || !cpRE.MatchString(id) {
		return fmt.Errorf("bad checkpoint id %s: ids look like cp-3 (see den checkpoints NAME): %w", Quote(id), ErrInvalid)
	}
	return nil
}

// Comment checks a checkpoint's comment: UTF-8 text of at most
// MaxComment bytes, without NUL.
func Comment(s string) error { return text("checkpoint comment", s, MaxComment) }

// KeyName checks a key's name: UTF-8 text of at most MaxKeyName bytes,
// without control characters.
func KeyName(s string) error {
	if err := text("key name", s, MaxKeyName); err != nil {
		return err
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("bad key name %s: no control characters: %w", Quote(s), ErrInvalid)
		}
	}
	return nil
}

// PublicKey checks the length of a public key as sent (its form is
// users.ParseAuthorizedKey's to check).
func PublicKey(s string) error {
	if len(s) > MaxPublicKey {
		return fmt.Errorf("public key of %d bytes is too long: at most %d KiB: %w", len(s), MaxPublicKey>>10, ErrInvalid)
	}
	return nil
}

// KeyRef checks a key's fingerprint or name given to remove it.
func KeyRef(s string) error {
	if s == "" {
		return fmt.Errorf("missing key fingerprint or name: %w", ErrInvalid)
	}
	return text("key fingerprint or name", s, MaxKeyRef)
}

// TokenID checks an API token's public id: "tok_" and 8 lower-case hex
// digits.
func TokenID(id string) error {
	if !tokIDRE.MatchString(id) {
		return fmt.Errorf("bad token id %s: ids look like tok_0a1b2c3d (see den tokens ls): %w", Quote(id), ErrInvalid)
	}
	return nil
}

// TokenName checks an API token's name: 1 to 64 letters, digits, '.',
// '_', '@' or '-', starting with a letter or digit, and not of a token
// id's form (a name is given on the command line to remove the token,
// where it must not be taken for another token's id).
func TokenName(name string) error {
	if !tokRE.MatchString(name) {
		return fmt.Errorf("bad token name %s: use 1-%d letters, digits, '.', '_', '@' or '-', starting with a letter or digit: %w", Quote(name), MaxTokenName, ErrInvalid)
	}
	if tokIDRE.MatchString(name) {
		return fmt.Errorf("bad token name %q: it has the form of a token id: %w", name, ErrInvalid)
	}
	return nil
}

// TokenRef checks an API token's id or name given to remove it.
func TokenRef(s string) error {
	if s == "" {
		return fmt.Errorf("missing token id or name: %w", ErrInvalid)
	}
	if TokenID(s) != nil && TokenName(s) != nil {
		return fmt.Errorf("bad token id or name %s: %w", Quote(s), ErrInvalid)
	}
	return nil
}

// Duration checks the length of a duration as sent (its form is
// time.ParseDuration's to check).
func Duration(what, s string) error { return text(what, s, MaxDuration) }

// GuestPath checks a file's path in a guest, as sent to read or write
// it: UTF-8 of 1 to MaxGuestPath bytes, without NUL (relative paths are
// the guest user's home's).
func GuestPath(p string) error {
	if p == "" {
		return fmt.Errorf("missing path: %w", ErrInvalid)
	}
	return text("path", p, MaxGuestPath)
}

// EnvEntry checks an environment entry for a command in a guest:
// KEY=VALUE, KEY not empty.
func EnvEntry(kv string) error {
	if i := strings.IndexByte(kv, '='); i <= 0 {
		return fmt.Errorf("bad environment entry %s: use KEY=VALUE: %w", Quote(kv), ErrInvalid)
	}
	return text("environment entry", kv, MaxEnvEntry)
}

// text checks a free string: at most max bytes of UTF-8, without NUL.
func text(what, s string, max int) error {
	switch {
	case len(s) > max:
		return fmt.Errorf("%s of %d bytes is too long: at most %d: %w", what, len(s), max, ErrInvalid)
	case !utf8.ValidString(s):
		return fmt.Errorf("bad %s %s: not UTF-8: %w", what, Quote(s), ErrInvalid)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("bad %s %s: no NUL bytes: %w", what, Quote(s), ErrInvalid)
		}
	}
	return nil
}
