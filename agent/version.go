package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
)

// VersionMagic starts every SSH version line, and so every connection on
// the guest channel.
const VersionMagic = "SSH-2.0-"

const (
	clientSoftware = "den_"
	serverSoftware = "denagent_"
	// maxVersionLine bounds a version line (RFC 4253 says 255 bytes).
	maxVersionLine = 255
	// maxStaleBytes bounds what Dial skips before the agent's version line.
	maxStaleBytes = 8 << 20
)

// newNonce returns 16 random hex digits.
func newNonce() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// clientVersion is the version line (without CRLF) the client sends.
func clientVersion(nonce string) string {
	return VersionMagic + clientSoftware + nonce
}

// ClientNonce returns the nonce in a den client's version line (with or
// without its CRLF), or "" if the line carries none.
func ClientNonce(line string) string {
	line = strings.TrimRight(line, "\r\n")
	s, ok := strings.CutPrefix(line, VersionMagic+clientSoftware)
	if !ok || len(s) == 0 || len(s) > 64 {
		return ""
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return ""
		}
	}
	return s
}

// ServerVersion is the agent's version line (without CRLF) for a client
// that sent nonce ("" for other clients).
func ServerVersion(nonce string) string {
	v := VersionMagic + serverSoftware + strings.Map(func(r rune) rune {
		if r <= ' ' || r == '-' || r > '~' {
			return '.'
		}
		return r
	}, Version)
	if nonce != "" {
		v += " " + nonce
	}
	return v
}

// syncConn hides everything the agent sent before its version line for
// this connection: the tail of an earlier connection on a serial port.
type syncConn struct {
	net.Conn
	nonce   string
	synced  bool
	pending []byte
}

func newSyncConn(c net.Conn, nonce string) *syncConn {
	return &syncConn{Conn: c, nonce: nonce}
}

func (c *syncConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if c.synced {
		return c.Conn.Read(p)
	}
	if err := c.sync(); err != nil {
		return 0, err
	}
	return c.Read(p)
}

// sync reads until the agent's version line with our nonce and keeps it,
// and what follows, in pending.
func (c *syncConn) sync() error {
	magic := []byte(VersionMagic)
	var data []byte
	buf := make([]byte, 4096)
	skipped := 0
	for {
		for {
			i := bytes.Index(data, magic)
			if i < 0 {
				if keep := len(magic) - 1; len(data) > keep {
					data = data[len(data)-keep:]
				}
				break
			}
			j := bytes.IndexByte(data[i:], '\n')
			if j < 0 {
				if len(data)-i > maxVersionLine {
					data = data[i+1:]
					continue
				}
				data = data[i:]
				break
			}
			line := strings.TrimRight(string(data[i:i+j]), "\r")
			if strings.HasSuffix(line, " "+c.nonce) {
				c.pending = append([]byte(nil), data[i:]...)
				c.synced = true
				return nil
			}
			data = data[i+1:]
		}
		if skipped > maxStaleBytes {
			return fmt.Errorf("agent: no version line for this connection in %d bytes", skipped)
		}
		n, err := c.Conn.Read(buf)
		data = append(data, buf[:n]...)
		skipped += n
		if err != nil {
			if n > 0 {
				continue
			}
			return fmt.Errorf("agent: waiting for the agent's version line: %w", err)
		}
	}
}
