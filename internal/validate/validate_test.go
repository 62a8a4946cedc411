package validate

import (
	"errors"
	"strings"
	"testing"
)

func TestRules(t *testing.T) {
	long := strings.Repeat("a", 300)
	for _, c := range []struct {
		what  string
		check func(string) error
		ok    []string
		bad   []string
	}{
		{"vm name", VMName,
			[]string{"a", "box", "box-2", "0", strings.Repeat("a", 63)},
			[]string{"", "-a", "a-", "A", "a_b", "a.b", "../x", "a/b", "a\x00b", "den", "help", strings.Repeat("a", 64), long}},
		{"user", User,
			[]string{"default", "alice", "alice@example.com", "a.b_c-d", strings.Repeat("u", 64)},
			[]string{"", ".x", "../x", "a/b", "a b", "a\x00b", "é", strings.Repeat("u", 65), long}},
		{"image", Image,
			[]string{"debian", "minimal", "bzImage", "ubuntu-24.04", strings.Repeat("i", 64)},
			[]string{"", ".", "..", "../x", "a/b", "/etc/passwd", "a\x00", " debian", strings.Repeat("i", 65), long}},
		{"checkpoint id", CheckpointID,
			[]string{"cp-1", "cp-42", "cp-" + strings.Repeat("9", 20)},
			[]string{"", "cp-0", "cp-01", "cp-", "cp-x", "../x", "cp-1\x00", "cp-1/..", "cp-" + strings.Repeat("9", 21), long}},
		{"comment", Comment,
			[]string{"", "deps installed", "line\nline\ttab", "é ✓", strings.Repeat("c", MaxComment)},
			[]string{"a\x00b", "\xff\xfe", strings.Repeat("c", MaxComment+1)}},
		{"key name", KeyName,
			[]string{"", "laptop", "alice@host", "my key é", strings.Repeat("k", MaxKeyName)},
			[]string{"a\x00b", "a\nb", "a\x1b[2J", "\xff", strings.Repeat("k", MaxKeyName+1)}},
		{"guest path", GuestPath,
			[]string{"/etc/hostname", "notes.txt", "/tmp/é ✓", strings.Repeat("p", MaxGuestPath)},
			[]string{"", "a\x00b", "\xff", strings.Repeat("p", MaxGuestPath+1)}},
		{"environment entry", EnvEntry,
			[]string{"A=1", "A=", "PATH=/bin:/usr/bin", "K=" + strings.Repeat("v", MaxEnvEntry-2)},
			[]string{"", "A", "=1", "A=\x00", "K=" + strings.Repeat("v", MaxEnvEntry-1)}},
		{"key ref", KeyRef,
			[]string{"laptop", "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"},
			[]string{"", "a\x00", long}},
		{"token id", TokenID,
			[]string{"tok_0a1b2c3d", "tok_ffffffff"},
			[]string{"", "tok_", "tok_0A1B2C3D", "tok_0a1b2c3", "tok_0a1b2c3d4", "tok-0a1b2c3d", "tok_0a1b2c3d\x00", long}},
		{"token name", TokenName,
			[]string{"ci", "laptop-sdk", "alice@host", "tok_ci", "tok_0a1b2c3", strings.Repeat("t", MaxTokenName)},
			[]string{"", "-x", ".x", "a b", "a/b", "a\x00", "a\nb", "é", "tok_0a1b2c3d", strings.Repeat("t", MaxTokenName+1), long}},
		{"token ref", TokenRef,
			[]string{"ci", "tok_0a1b2c3d"},
			[]string{"", "a b", "a\x00", "den_secret/x", long}},
	} {
		for _, v := range c.ok {
			if err := c.check(v); err != nil {
				t.Errorf("%s %s: %v", c.what, Quote(v), err)
			}
		}
		for _, v := range c.bad {
			err := c.check(v)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s %s: %v, want invalid", c.what, Quote(v), err)
			}
			if err != nil && len(err.Error()) > 300 {
				t.Errorf("%s: the error quotes the value whole: %s", c.what, err)
			}
		}
	}
}

func TestQuote(t *testing.T) {
	if got := Quote("a\x00b"); got != `"a\x00b"` {
		t.Errorf("Quote: %s", got)
	}
	got := Quote(strings.Repeat("x", 64<<10))
	if len(got) > QuoteMax+40 || !strings.HasSuffix(got, "... (65536 bytes)") {
		t.Errorf("Quote of 64 KiB: %s", got)
	}
}
