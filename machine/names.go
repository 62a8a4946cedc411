package machine

import (
	"fmt"
	"regexp"

	"github.com/denhq/den/internal/size"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateName checks that a VM name is a DNS label: 1 to 63 lower-case
// letters, digits and hyphens, not starting or ending with a hyphen. VM
// names become hostnames and SSH user names; "den" and "help" are reserved.
func ValidateName(name string) error {
	if !dnsLabel.MatchString(name) {
		return fmt.Errorf("bad vm name %q: use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit: %w", name, ErrInvalid)
	}
	if reserved[name] {
		return fmt.Errorf("vm name %q is reserved (ssh den@host runs den verbs; den VERB help shows help): %w", name, ErrInvalid)
	}
	return nil
}

// reserved names mean something else to the SSH gateway
// ("den"), or to den's CLI ("help": every verb takes it as a subcommand).
var reserved = map[string]bool{"den": true, "help": true}

// ParseSize reads a size such as "512M", "2G", "1.5GiB" or "1073741824"
// (bytes); units are powers of 1024. See size.Parse.
func ParseSize(s string) (int64, error) {
	b, err := size.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	return b, nil
}

// FormatSize prints bytes with a binary unit: 512M, 4G, 1.5G. See
// size.Format.
func FormatSize(b int64) string { return size.Format(b) }
