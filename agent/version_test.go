package agent

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestNonceRoundTrip(t *testing.T) {
	n := newNonce()
	if len(n) != 16 || ClientNonce(clientVersion(n)+"\r\n") != n {
		t.Fatalf("nonce %q not recovered from %q", n, clientVersion(n))
	}
	for _, bad := range []string{"SSH-2.0-OpenSSH_9.2", "SSH-2.0-den_", "SSH-2.0-den_XYZ", "SSH-2.0-den_12 34"} {
		if ClientNonce(bad) != "" {
			t.Errorf("ClientNonce(%q) should be empty", bad)
		}
	}
	v := ServerVersion(n)
	if !strings.HasPrefix(v, VersionMagic+"denagent_") || !strings.HasSuffix(v, " "+n) {
		t.Errorf("server version %q", v)
	}
	old := Version
	Version = "1.2-dev x"
	defer func() { Version = old }()
	if v := ServerVersion(""); v != "SSH-2.0-denagent_1.2.dev.x" {
		t.Errorf("sanitized version %q", v)
	}
}

// TestSyncConnSkipsStaleBytes feeds the tail of an old connection, an old
// agent version line and a split line before the real one.
func TestSyncConnSkipsStaleBytes(t *testing.T) {
	nonce := "00112233aabbccdd"
	want := ServerVersion(nonce) + "\r\nafter the version line"
	stale := "\x00\xffSSH-2.0-denagent_0.1.0 ffffffffffffffff\r\n\x14binary kexinit" +
		"SSH-2.0-no newline for a long time " + strings.Repeat("x", 300) + "\n"
	for _, chunk := range []int{1, 3, 7, 4096} {
		a, b := net.Pipe()
		go func() {
			data := []byte(stale + want)
			for len(data) > 0 {
				n := min(chunk, len(data))
				b.Write(data[:n])
				data = data[n:]
			}
			b.Close()
		}()
		a.SetDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(newSyncConn(a, nonce))
		if err != nil || string(got) != want {
			t.Errorf("chunk %d: got %q, %v", chunk, got, err)
		}
		a.Close()
	}
}

func TestSyncConnGivesUp(t *testing.T) {
	a, b := net.Pipe()
	go func() {
		b.Write([]byte("SSH-2.0-denagent_0.1.0 someoneelse\r\n"))
		b.Close()
	}()
	a.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(newSyncConn(a, "0011")); err == nil {
		t.Error("read without our version line succeeded")
	}
}

func TestQuoteCommand(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"make", "test"}, "make test"},
		{[]string{"echo", "a b", ""}, "echo 'a b' ''"},
		{[]string{"FOO=bar", "x"}, "'FOO=bar' x"},
		{[]string{"it's"}, `'it'\''s'`},
		{[]string{"$HOME", "~", "*"}, `'$HOME' '~' '*'`},
	} {
		if got := QuoteCommand(tc.argv); got != tc.want {
			t.Errorf("QuoteCommand(%q) = %s, want %s", tc.argv, got, tc.want)
		}
	}
}
