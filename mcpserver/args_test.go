package mcpserver

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/denhq/den/api"
)

// connect runs a server whose client reaches no daemon (a socket path
// nobody listens on) and returns a client session to it: a call that
// gets past argument checking fails with the connection's error.
func connect(t *testing.T) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	srv := New(api.NewClient(filepath.Join(t.TempDir(), "nobody.sock")), nil)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestArguments: every bad argument is refused as a tool error of one
// line that says what is wrong, before the daemon is asked (the
// daemon's connection error would say "connect to den daemon"); good
// ones get as far as the daemon.
func TestArguments(t *testing.T) {
	cs := connect(t)
	ctx := context.Background()
	long := strings.Repeat("x", 200<<10)
	cases := []struct {
		tool string
		args map[string]any
		want string // "" : passes the checks
	}{
		{"info", map[string]any{"name": "Bad_Name"}, `bad vm name "Bad_Name"`},
		{"info", map[string]any{}, `missing properties: ["name"]`},
		{"info", map[string]any{"name": "box", "nme": "x"}, `unexpected additional properties ["nme"]`},
		{"info", map[string]any{"name": "box"}, ""},
		{"create", map[string]any{"name": "den"}, `vm name "den" is reserved`},
		{"create", map[string]any{"name": "box", "image": "../etc"}, `bad image name "../etc"`},
		{"create", map[string]any{"name": "box", "memory": "12Q"}, `memory: `},
		{"create", map[string]any{"name": "box", "cpus": -1}, `bad cpus -1`},
		{"create", map[string]any{"name": "box", "egress": "allow:"}, `egress: `},
		{"create", map[string]any{"name": "box", "idle_timeout": strings.Repeat("9", 100)}, `idle timeout of 100 bytes is too long`},
		{"create", map[string]any{"name": "box", "memory": "1G", "disk": "8G"}, ""},
		{"exec", map[string]any{"name": "box", "command": ""}, `missing command`},
		{"exec", map[string]any{"name": "box", "command": long}, `command line is 204800 bytes, at most 131071`},
		{"exec", map[string]any{"name": "box", "command": "true", "env": []string{"NOEQUALS"}}, `bad environment entry "NOEQUALS"`},
		{"exec", map[string]any{"name": "box", "command": "true", "timeout_seconds": 601}, `bad timeout_seconds 601: give 1 to 600`},
		{"exec", map[string]any{"name": "box", "command": "true", "timeout_seconds": -1}, `bad timeout_seconds -1`},
		{"exec", map[string]any{"name": "box", "command": "true", "max_output_bytes": 2 << 20}, `bad max_output_bytes 2097152: give 1 to 1048576`},
		{"exec", map[string]any{"name": "box", "command": "true", "workdir": "a\x00b"}, `workdir: bad path`},
		{"exec", map[string]any{"name": "box", "command": "true", "stdin": strings.Repeat("s", MaxStdinBytes+1)}, `stdin is 1048577 bytes`},
		{"exec", map[string]any{"name": "box", "command": "true", "timeout_seconds": 600, "max_output_bytes": 1}, ""},
		{"read_file", map[string]any{"name": "box", "path": ""}, `missing path`},
		{"read_file", map[string]any{"name": "box", "path": "/x", "max_bytes": MaxFileBytes + 1}, `bad max_bytes 2097153`},
		{"read_file", map[string]any{"name": "box", "path": "/x", "offset": -5}, `bad offset -5`},
		{"read_file", map[string]any{"name": "box", "path": "/etc/hostname"}, ""},
		{"write_file", map[string]any{"name": "box", "path": "/x", "content": "!!", "encoding": "base64"}, `content is not base64`},
		{"write_file", map[string]any{"name": "box", "path": "/x", "content": "a", "encoding": "hex"}, `bad encoding "hex"`},
		{"write_file", map[string]any{"name": "box", "path": "/x", "content": "a", "mode": "0999"}, `bad mode "0999"`},
		{"write_file", map[string]any{"name": "box", "path": "/x", "content": strings.Repeat("c", MaxFileBytes+1)}, `content is 2097153 bytes, at most 2097152`},
		{"write_file", map[string]any{"name": "box", "path": "/x", "content": "hi", "mode": "4755"}, ""},
		{"checkpoint", map[string]any{"name": "box", "comment": "a\x00b"}, `bad checkpoint comment`},
		{"restore", map[string]any{"name": "box", "checkpoint": "cp-0"}, `bad checkpoint id "cp-0"`},
		{"restore", map[string]any{"name": "box", "checkpoint": "cp-2"}, ""},
		{"fork", map[string]any{"name": "box", "new_name": "Copy"}, `new_name: bad vm name "Copy"`},
		{"fork", map[string]any{"name": "box", "new_name": "copy", "checkpoint": "cp-x"}, `bad checkpoint id "cp-x"`},
		{"sleep", map[string]any{"name": "-box"}, `bad vm name "-box"`},
		{"wake", map[string]any{"name": "help"}, `vm name "help" is reserved`},
		{"url", map[string]any{"name": strings.Repeat("a", 64)}, `bad vm name`},
	}
	for _, c := range cases {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("%s %.80v: protocol error %v, want a tool error", c.tool, c.args, err)
			continue
		}
		text := resultText(res)
		if !res.IsError {
			t.Errorf("%s %.80v: %s, want an error", c.tool, c.args, text)
			continue
		}
		if c.want == "" {
			if !strings.Contains(text, "connect to den daemon") {
				t.Errorf("%s %.80v: %q, want the arguments to pass and the daemon to be asked", c.tool, c.args, text)
			}
			continue
		}
		if !strings.Contains(text, c.want) || strings.Contains(text, "connect to den daemon") || strings.Count(strings.TrimSpace(text), "\n") > 0 {
			t.Errorf("%s %.80v: %q, want one line with %q, before the daemon is asked", c.tool, c.args, text, c.want)
		}
	}
}

// resultText is a result's text content.
func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestCatalog: the tools the MCP bullet names are listed with schemas,
// and the checkpoint tree is a resource template.
func TestCatalog(t *testing.T) {
	cs := connect(t)
	ctx := context.Background()
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, tool := range lt.Tools {
		have[tool.Name] = true
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s: no description or input schema", tool.Name)
		}
	}
	for _, name := range []string{"list", "create", "exec", "read_file", "write_file", "checkpoint", "checkpoints", "restore", "fork", "diff", "activity", "sleep", "wake", "url", "info"} {
		if !have[name] {
			t.Errorf("no tool %s (have %v)", name, have)
		}
	}
	rt, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rt.ResourceTemplates) != 1 || rt.ResourceTemplates[0].URITemplate != treeTemplate {
		data, _ := json.Marshal(rt)
		t.Errorf("resource templates: %s", data)
	}
	// A bad tree URI is refused before the daemon is asked.
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "den://vms/Bad/checkpoints"}); err == nil || !strings.Contains(err.Error(), `bad vm name "Bad"`) {
		t.Errorf("read den://vms/Bad/checkpoints: %v", err)
	}
}

// TestCapped: exec keeps what its cap allows, counts the rest, and
// returns valid UTF-8 even when the cap cuts a rune.
func TestCapped(t *testing.T) {
	c := &capped{max: 5}
	c.Write([]byte("abcd"))
	c.Write([]byte("é-and-more")) // é is 2 bytes: cut after its first
	text, total, cut := c.result()
	if text != "abcd\uFFFD" || total != 4+int64(len("é-and-more")) || !cut {
		t.Errorf("over the cap: %q, total %d, truncated %v", text, total, cut)
	}
	small := &capped{max: 10}
	small.Write([]byte("ok"))
	if text, total, cut := small.result(); text != "ok" || total != 2 || cut {
		t.Errorf("under the cap: %q, total %d, truncated %v", text, total, cut)
	}
}

// TestQuiet: the SDK's Info lines are dropped from the daemon's log, its
// warnings kept, with their attributes.
func TestQuiet(t *testing.T) {
	var buf strings.Builder
	l := quiet(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Info("server session connected")
	l.With("component", "mcp").Warn("rejecting request")
	if out := buf.String(); strings.Contains(out, "connected") || !strings.Contains(out, "rejecting request") || !strings.Contains(out, "component=mcp") {
		t.Errorf("log: %q", out)
	}
}
