//go:build linux

package guest

import (
	"fmt"
	"os"
	"strings"

	"github.com/denhq/den/agent"
)

// Cmdline is what the agent reads from the kernel command line.
type Cmdline struct {
	// Keys are the den.key values (<type>:<base64>).
	Keys []string
	// IP is den.ip (ADDR/PREFIX), GW den.gw, DNS the den.dns servers
	// (repeated or comma-separated).
	IP  string
	GW  string
	DNS []string
	// Hostname is den.hostname.
	Hostname string
	// Identity is den.identity: 32 lowercase hex digits, new for every
	// VM. A boot whose den.identity differs from /etc/den/identity gets a
	// new identity (see ApplyBootIdentity).
	Identity string
}

// ReadCmdline parses /proc/cmdline (or another file with its format).
func ReadCmdline(path string) (Cmdline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Cmdline{}, fmt.Errorf("read kernel command line: %w", err)
	}
	return ParseCmdline(string(data)), nil
}

// ParseCmdline parses a kernel command line; values may be double-quoted.
func ParseCmdline(s string) Cmdline {
	var c Cmdline
	for _, f := range splitCmdline(s) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case agent.CmdlineKey:
			c.Keys = append(c.Keys, v)
		case "den.ip":
			c.IP = v
		case "den.gw":
			c.GW = v
		case "den.dns":
			for _, d := range strings.Split(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					c.DNS = append(c.DNS, d)
				}
			}
		case "den.hostname":
			c.Hostname = v
		case "den.identity":
			c.Identity = v
		}
	}
	return c
}

// splitCmdline splits on blanks outside double quotes and drops the quotes.
func splitCmdline(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}
