// Package size parses and prints byte sizes with binary units.
package size

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"
)

// MiB is 1<<20 bytes, the unit VM memory and disks are counted in.
const MiB = 1 << 20

// number is what comes before the unit: digits with an optional decimal
// fraction. No sign, exponent, hex, NaN or Inf.
var number = regexp.MustCompile(`^([0-9]+(\.[0-9]*)?|\.[0-9]+)$`)

var units = map[byte]int64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}

const (
	hintBytes = "use a number with K, M, G or T (powers of 1024), e.g. 512M or 4G"
	hintMiB   = "use a whole number of MiB with K, M, G or T, e.g. 512M or 4G"
)

// Parse reads a size such as "512M", "2G", "1.5GiB", "4 gb" or
// "1073741824" (bytes, without a unit). Units are powers of 1024 and
// may end in "B" or "iB". The size must be a whole number of bytes, more
// than zero and below 8 EiB.
func Parse(s string) (int64, error) {
	return parse(s, 1, hintBytes, "not a whole number of bytes")
}

// ParseMiB is Parse for VM memory and disks, which are counted in MiB:
// "1.5G" (1536M) and "1048576" are fine, "1000K" and "0.5M" are not.
func ParseMiB(s string) (int64, error) {
	return parse(s, MiB, hintMiB, hintMiB)
}

// parse reads s and requires a multiple of quantum bytes; hint is the
// message for syntax errors, whole the one for sizes that are not a
// multiple of quantum.
func parse(s string, quantum int64, hint, whole string) (int64, error) {
	num := strings.ToUpper(strings.TrimSpace(s))
	if u, ok := strings.CutSuffix(num, "IB"); ok {
		num = u
		if !strings.ContainsAny(num[max(len(num)-1, 0):], "KMGT") {
			// "IB" alone, or "5IB": not a unit.
			return 0, fmt.Errorf("bad size %q: %s", s, hint)
		}
	} else {
		num = strings.TrimSuffix(num, "B")
	}
	mult := int64(1)
	if n := len(num); n > 0 {
		if m, ok := units[num[n-1]]; ok {
			mult, num = m, strings.TrimSpace(num[:n-1])
		}
	}
	if strings.HasPrefix(num, "-") && number.MatchString(num[1:]) {
		return 0, fmt.Errorf("bad size %q: must be more than zero", s)
	}
	if !number.MatchString(num) {
		return 0, fmt.Errorf("bad size %q: %s", s, hint)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("bad size %q: %s", s, hint)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	switch {
	case r.Sign() <= 0:
		return 0, fmt.Errorf("bad size %q: must be more than zero", s)
	case r.Cmp(new(big.Rat).SetInt64(math.MaxInt64)) > 0:
		return 0, fmt.Errorf("bad size %q: too large", s)
	case !r.IsInt():
		return 0, fmt.Errorf("bad size %q: %s", s, whole)
	}
	b := r.Num().Int64()
	if b%quantum != 0 {
		return 0, fmt.Errorf("bad size %q: %s", s, whole)
	}
	return b, nil
}

// Format prints bytes with a binary unit and at most one decimal: 512M,
// 4G, 1.5G, 100 (bytes).
func Format(b int64) string {
	if b < 0 {
		if b == math.MinInt64 {
			return "-8388608T"
		}
		return "-" + Format(-b)
	}
	suffix := []string{"", "K", "M", "G", "T"}
	f := float64(b)
	i := 0
	for i < len(suffix)-1 && math.Round(f*10)/10 >= 1024 {
		f /= 1024
		i++
	}
	r := math.Round(f*10) / 10
	if r == math.Trunc(r) {
		return fmt.Sprintf("%d%s", int64(r), suffix[i])
	}
	return fmt.Sprintf("%.1f%s", r, suffix[i])
}
