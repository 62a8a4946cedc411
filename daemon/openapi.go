package daemon

import (
	"io"
	"net/http"

	"github.com/denhq/den/api"
)

// getOpenAPI answers the API's OpenAPI document (api/openapi.yaml). It is
// no secret, but it is served like every route, to a caller the
// connection (or a token) proved: the daemon has one rule for who may
// talk to it, and the audit log sees who read it.
func (s *Server) getOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, api.OpenAPI)
}
