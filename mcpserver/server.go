// Package mcpserver serves den's VMs as Model Context Protocol tools and
// resources, translating each call onto den's API as its caller.
//
// The server holds nothing of its own: every tool is one or two calls of
// an api.Client (the user's socket or TLS connection for `den mcp`, an
// in-process connection as the token's user for the daemon's /v1/mcp),
// so the daemon decides, as for any CLI call, who may see and touch
// what. Arguments are checked by den's validation layer
// (internal/validate, internal/size, egress) before anything is sent,
// and a refusal, by this package or by the daemon, is a tool error
// (isError) of one line, never a protocol error.
package mcpserver

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/denhq/den/api"
)

// Version is what the server says of itself at initialization.
var Version = "dev"

// schemas caches the tools' JSON schemas: the daemon makes a server per
// HTTP request.
var schemas = mcp.NewSchemaCache()

// New returns an MCP server whose tools and resources act through cl.
func New(cl *api.Client, log *slog.Logger) *mcp.Server {
	if log == nil {
		log = slog.Default()
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "den", Title: "den: long-lived microVMs", Version: Version},
		&mcp.ServerOptions{
			Instructions: instructions,
			Logger:       quiet(log),
			SchemaCache:  schemas,
		})
	t := &tools{api: cl}
	t.add(s)
	addResources(s, cl)
	return s
}

// instructions tell a model what den is and how the tools fit together.
const instructions = `den runs long-lived Linux microVMs that keep their disk and memory.
Create a VM (create), run commands in it (exec; exit status, stdout and stderr
in the result), read and write its files (read_file, write_file). Take a
checkpoint (memory and disk at one instant) before something risky, restore it
to go back, fork it to try something else side by side. A VM sleeps when idle
and wakes by itself when reached; sleep and wake do it at once. url gives an
HTTP URL that reaches a port of the VM. The resource den://vms/NAME/checkpoints
is a VM's checkpoint tree.`

// HTTPHandler serves MCP over streamable HTTP, statelessly: each request
// gets a server of its own, acting through the client that clientOf
// gives for it (the request's caller's), and done, when not nil, is
// called with that client once the request is answered.
func HTTPHandler(clientOf func(*http.Request) *api.Client, done func(*api.Client), log *slog.Logger) http.Handler {
	type clientKey struct{}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		cl, _ := r.Context().Value(clientKey{}).(*api.Client)
		return New(cl, log)
	}, &mcp.StreamableHTTPOptions{Stateless: true, Logger: quiet(log)})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cl := clientOf(r)
		if done != nil {
			defer done(cl)
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientKey{}, cl)))
	})
}

// quiet is log without the SDK's Info lines (a session connected,
// initialized, ended: several per HTTP request); warnings and errors pass.
func quiet(log *slog.Logger) *slog.Logger {
	if log == nil {
		log = slog.Default()
	}
	return slog.New(warnings{log.Handler()})
}

// warnings passes on records of level Warn and above.
type warnings struct{ slog.Handler }

func (w warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}

func (w warnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnings{w.Handler.WithAttrs(attrs)}
}

func (w warnings) WithGroup(name string) slog.Handler { return warnings{w.Handler.WithGroup(name)} }
