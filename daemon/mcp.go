package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/denhq/den/api"
)

// serveMCP serves the Model Context Protocol over streamable HTTP
// (stateless: each POST is answered on its own) as the request's caller:
// each tool call is a call of this API, in-process, as that caller, so
// that a token's user sees and touches only their own VMs, as everywhere
// else, and each call is audited as the user's ("mcp" in its source).
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request) {
	if s.inproc == nil {
		writeError(w, errors.New("mcp: this server makes no in-process connections to its own API"))
		return
	}
	s.mcp.ServeHTTP(w, r)
}

// mcpClient is the API client that the MCP request r's tools call
// through: in-process connections that carry r's caller.
func (s *Server) mcpClient(r *http.Request) *api.Client {
	caller := callerOf(r)
	caller.Source = "mcp " + caller.Source
	return api.NewDialClient("the den daemon", func(ctx context.Context) (net.Conn, error) {
		return s.inproc.dial(ctx, caller)
	})
}
