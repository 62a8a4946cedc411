package mcpserver

import (
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/validate"
)

// Caps of the guest tools: what one call may run for, return or write.
// docs/mcp.md lists them.
const (
	DefaultExecTimeout = 60 * time.Second
	MaxExecTimeout     = 10 * time.Minute
	// DefaultOutputBytes and MaxOutputBytes cap what exec returns of
	// each of stdout and stderr (the rest is counted, not kept).
	DefaultOutputBytes = 64 << 10
	MaxOutputBytes     = 1 << 20
	// MaxStdinBytes bounds exec's stdin.
	MaxStdinBytes = 1 << 20
	// DefaultReadBytes and MaxFileBytes cap read_file's answer;
	// MaxFileBytes also bounds write_file's content (decoded): its
	// base64 stays under the HTTP transport's 4 MiB body.
	DefaultReadBytes = 256 << 10
	MaxFileBytes     = 2 << 20
)

// execTimeout is exec's timeout_seconds as a duration: 0 takes
// DefaultExecTimeout.
func execTimeout(seconds int) (time.Duration, error) {
	switch {
	case seconds == 0:
		return DefaultExecTimeout, nil
	case seconds < 0 || time.Duration(seconds)*time.Second > MaxExecTimeout:
		return 0, fmt.Errorf("bad timeout_seconds %d: give 1 to %d (default %d)", seconds, int(MaxExecTimeout/time.Second), int(DefaultExecTimeout/time.Second))
	}
	return time.Duration(seconds) * time.Second, nil
}

// byteCap is a requested cap of n bytes: 0 takes def, and more than max
// or less than 0 is refused.
func byteCap(what string, n, def, max int) (int, error) {
	switch {
	case n == 0:
		return def, nil
	case n < 0 || n > max:
		return 0, fmt.Errorf("bad %s %d: give 1 to %d (default %d)", what, n, max, def)
	}
	return n, nil
}

// checkExec checks exec's arguments before the VM is reached.
func checkExec(in ExecInput) error {
	if err := validate.VMName(in.Name); err != nil {
		return err
	}
	if in.Command == "" {
		return fmt.Errorf("missing command: give a shell command line, e.g. \"uname -a\"")
	}
	if n := len(in.Command); n > agent.MaxCommandLine {
		return fmt.Errorf("command line is %d bytes, at most %d: pass large data with stdin or write_file", n, agent.MaxCommandLine)
	}
	for _, kv := range in.Env {
		if err := validate.EnvEntry(kv); err != nil {
			return err
		}
	}
	if in.Workdir != "" {
		if err := validate.GuestPath(in.Workdir); err != nil {
			return fmt.Errorf("workdir: %w", err)
		}
	}
	if n := len(in.Stdin); n > MaxStdinBytes {
		return fmt.Errorf("stdin is %d bytes, at most %d: write large data with write_file", n, MaxStdinBytes)
	}
	if _, err := execTimeout(in.TimeoutSeconds); err != nil {
		return err
	}
	_, err := byteCap("max_output_bytes", in.MaxOutputBytes, DefaultOutputBytes, MaxOutputBytes)
	return err
}

// fileMode parses write_file's mode: octal permission bits, with the
// setuid, setgid and sticky bits; ok is false for "" (the default: 0644
// for a new file, an existing one keeps its own).
func fileMode(s string) (mode os.FileMode, ok bool, err error) {
	if s == "" {
		return 0, false, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, false, fmt.Errorf("bad mode %s: give octal permission bits, e.g. \"0755\"", validate.Quote(s))
	}
	mode = os.FileMode(m & 0o777)
	for bit, fm := range map[uint64]os.FileMode{0o4000: os.ModeSetuid, 0o2000: os.ModeSetgid, 0o1000: os.ModeSticky} {
		if m&bit != 0 {
			mode |= fm
		}
	}
	return mode, true, nil
}

// fileContent decodes write_file's content as its encoding says, within
// MaxFileBytes.
func fileContent(content, encoding string) ([]byte, error) {
	var data []byte
	switch encoding {
	case "", "text":
		data = []byte(content)
	case "base64":
		d, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, fmt.Errorf("content is not base64: %w", err)
		}
		data = d
	default:
		return nil, fmt.Errorf("bad encoding %s: give text or base64", validate.Quote(encoding))
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("content is %d bytes, at most %d: write larger files with den's CLI (den exec NAME -- sh -c 'cat > f' < file, or scp through the gateway)", len(data), MaxFileBytes)
	}
	return data, nil
}

// encode is data as read_file returns it: text when it is UTF-8, else
// base64.
func encode(data []byte) (content, encoding string) {
	if utf8.Valid(data) {
		return string(data), "text"
	}
	return base64.StdEncoding.EncodeToString(data), "base64"
}

// capped keeps the first max bytes written to it and counts them all.
// It may be read while written: a command killed at its timeout leaves
// its session's copies running for a moment after Exec returns.
type capped struct {
	max int

	mu    sync.Mutex
	buf   []byte
	total int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if room := c.max - len(c.buf); room > 0 {
		c.buf = append(c.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// result is what was kept, as valid UTF-8 (a cut rune, or bytes that are
// not UTF-8, become U+FFFD), how much was written, and whether that was
// more than was kept.
func (c *capped) result() (text string, total int64, truncated bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.ToValidUTF8(string(c.buf), "\uFFFD"), c.total, c.total > int64(len(c.buf))
}
