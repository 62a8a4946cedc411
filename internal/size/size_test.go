package size

import (
	"math"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string // a part of the error; "" for none
	}{
		{"512M", 512 << 20, ""},
		{"512m", 512 << 20, ""},
		{"2G", 2 << 30, ""},
		{"1.5GiB", 1536 << 20, ""},
		{"1.5gib", 1536 << 20, ""},
		{"4 GB", 4 << 30, ""},
		{" 4g ", 4 << 30, ""},
		{"1T", 1 << 40, ""},
		{"1K", 1024, ""},
		{"1.5K", 1536, ""},
		{".5K", 512, ""},
		{"1.K", 1024, ""},
		{"1073741824", 1 << 30, ""},
		{"512B", 512, ""},
		{"1", 1, ""},
		{"8388607T", 8388607 << 40, ""},
		{"9223372036854775807", math.MaxInt64, ""},
		{"0.5", 0, "not a whole number of bytes"},
		{"0.1K", 0, "not a whole number of bytes"},
		{"0", 0, "more than zero"},
		{"0G", 0, "more than zero"},
		{"0.0M", 0, "more than zero"},
		{"-1G", 0, "more than zero"},
		{"-0.5", 0, "more than zero"},
		{"8388608T", 0, "too large"},
		{"9223372036854775808", 0, "too large"},
		{"99999999999999999999999999T", 0, "too large"},
		{"NaN", 0, "use a number"},
		{"nan", 0, "use a number"},
		{"Inf", 0, "use a number"},
		{"+Inf", 0, "use a number"},
		{"-Inf", 0, "use a number"},
		{"infinity", 0, "use a number"},
		{"1e3", 0, "use a number"},
		{"1e3M", 0, "use a number"},
		{"0x10", 0, "use a number"},
		{"+1G", 0, "use a number"},
		{"1/2G", 0, "use a number"},
		{"1_000", 0, "use a number"},
		{"", 0, "use a number"},
		{" ", 0, "use a number"},
		{"G", 0, "use a number"},
		{"B", 0, "use a number"},
		{"iB", 0, "use a number"},
		{"5iB", 0, "use a number"},
		{"1..5G", 0, "use a number"},
		{"1.5.G", 0, "use a number"},
		{"1GG", 0, "use a number"},
		{"1P", 0, "use a number"},
		{"1 G B", 0, "use a number"},
		{"abc", 0, "use a number"},
	} {
		got, err := Parse(tc.in)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("Parse(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("Parse(%q) = %d; want an error with %q", tc.in, got, tc.err)
			continue
		}
		if !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "bad size ") {
			t.Errorf("Parse(%q) error %q; want one with %q", tc.in, err, tc.err)
		}
	}
}

func TestParseMiB(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"512M", 512 << 20, ""},
		{"1.5G", 1536 << 20, ""},
		{"1.5GiB", 1536 << 20, ""},
		{"4G", 4 << 30, ""},
		{"2T", 2 << 40, ""},
		{"1024K", 1 << 20, ""},
		{"1048576", 1 << 20, ""},
		{"0.5M", 0, "whole number of MiB"},
		{"1000K", 0, "whole number of MiB"},
		{"512", 0, "whole number of MiB"},
		{"0.5", 0, "whole number of MiB"},
		{"1.0000001G", 0, "whole number of MiB"},
		{"NaN", 0, "whole number of MiB"},
		{"Inf", 0, "whole number of MiB"},
		{"-1G", 0, "more than zero"},
		{"0", 0, "more than zero"},
		{"9999999T", 0, "too large"},
	} {
		got, err := ParseMiB(tc.in)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParseMiB(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ParseMiB(%q) = %d, %v; want an error with %q", tc.in, got, err, tc.err)
		}
	}
	// The message the CLI shows for a typo.
	_, err := ParseMiB("NaN")
	if want := `bad size "NaN": use a whole number of MiB with K, M, G or T, e.g. 512M or 4G`; err == nil || err.Error() != want {
		t.Errorf("ParseMiB(NaN) error %v; want %q", err, want)
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0"},
		{1, "1"},
		{1023, "1023"},
		{1024, "1K"},
		{1536, "1.5K"},
		{512 << 20, "512M"},
		{1536 << 20, "1.5G"},
		{4 << 30, "4G"},
		{1<<30 - 1, "1G"},     // 1023.99...M rounds up to the next unit
		{1<<20 + 1<<10, "1M"}, // 1.001M
		{2 << 40, "2T"},
		{5000 << 40, "5000T"},
		{-512 << 20, "-512M"},
		{math.MinInt64, "-8388608T"},
		{math.MaxInt64, "8388608T"},
	} {
		if got := Format(tc.in); got != tc.want {
			t.Errorf("Format(%d) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

// TestRoundTrip: what Format prints for a whole number of MiB or of
// tenths of a unit reads back as the same size.
func TestRoundTrip(t *testing.T) {
	for _, b := range []int64{1 << 20, 512 << 20, 1536 << 20, 4 << 30, 2 << 40, 1 << 10, 1} {
		got, err := Parse(Format(b))
		if err != nil || got != b {
			t.Errorf("Parse(Format(%d) = %q) = %d, %v", b, Format(b), got, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"512M", "1.5GiB", "NaN", "-1", "0.5", "1e3", "99999999999T", ".5K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := Parse(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "bad size ") {
				t.Fatalf("Parse(%q) error %q", s, err)
			}
			return
		}
		if b <= 0 {
			t.Fatalf("Parse(%q) = %d", s, b)
		}
		m, err := ParseMiB(s)
		if err == nil && (m != b || m%MiB != 0) {
			t.Fatalf("ParseMiB(%q) = %d, Parse = %d", s, m, b)
		}
	})
}
