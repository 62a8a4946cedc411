package machine

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateName checks that a VM name is a DNS label: 1 to 63 lower-case
// letters, digits and hyphens, not starting or ending with a hyphen. VM
// names become hostnames and SSH user names; "den" is reserved.
func ValidateName(name string) error {
	if !dnsLabel.MatchString(name) {
		return fmt.Errorf("bad vm name %q: use 1-63 lower-case letters, digits and '-', starting and ending with a letter or digit: %w", name, ErrInvalid)
	}
	if reserved[name] {
		return fmt.Errorf("vm name %q is reserved (ssh den@host runs den verbs): %w", name, ErrInvalid)
	}
	return nil
}

// reserved names mean something else to the SSH gateway.
var reserved = map[string]bool{"den": true}

// ParseSize reads a size such as "512M", "2G", "1.5GiB" or "1073741824"
// (bytes); units are powers of 1024.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	up := strings.ToUpper(t)
	up = strings.TrimSuffix(strings.TrimSuffix(up, "IB"), "B")
	mult := int64(1)
	if n := len(up); n > 0 {
		switch up[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			up = up[:n-1]
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(up), 64)
	if err != nil || f <= 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("bad size %q: use a number with K, M, G or T (powers of 1024), e.g. 512M or 4G: %w", s, ErrInvalid)
	}
	return int64(f * float64(mult)), nil
}

// FormatSize prints bytes with a binary unit: 512M, 4G, 1.5G.
func FormatSize(b int64) string {
	units := []string{"", "K", "M", "G", "T"}
	f := float64(b)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d%s", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}
