package e2b

import (
	"fmt"
	"net/http"
	"strings"
)

// unsupported are E2B calls den does not serve, by path prefix, with
// what to use instead.
var unsupported = []struct{ prefix, instead string }{
	{"/templates", "den has no template builds: a template is a den image (make image builds them; den info lists them)"},
	{"/v2/templates", "den has no template builds: a template is a den image (make image builds them; den info lists them)"},
	{"/v3/templates", "den has no template builds: a template is a den image (make image builds them; den info lists them)"},
	{"/teams", "den has no teams: users and their tokens are den's (den tokens)"},
	{"/volumes", "den has no E2B volumes: a sandbox's disk is kept, and den checkpoint/den fork copy it"},
	{"/volumecontent", "den has no E2B volumes: a sandbox's disk is kept, and den checkpoint/den fork copy it"},
	{"/secrets", "den keeps no secrets: pass them in envVars"},
	{"/access-tokens", "den tokens are made with den tokens add"},
	{"/api-keys", "den tokens are made with den tokens add"},
	{"/nodes", "den's hosts are listed by den hosts"},
}

// unsupportedSandbox are sandbox calls (/sandboxes/ID/WHAT) den does not
// serve yet.
var unsupportedSandbox = map[string]string{
	"logs":    "E2B logs are not built yet: use den logs ID",
	"network": "changing a sandbox's network is not built yet: den's egress policy is set at create (allowOut/denyOut)",
}

func (s *Server) unsupportedRoutes() {
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		for _, u := range unsupported {
			if p == u.prefix || strings.HasPrefix(p, u.prefix+"/") {
				writeError(w, http.StatusNotImplemented, fmt.Sprintf("den: %s %s is not supported by den's E2B API: %s", r.Method, p, u.instead))
				return
			}
		}
		if rest, ok := strings.CutPrefix(strings.TrimPrefix(p, "/v2"), "/sandboxes/"); ok {
			if _, what, ok := strings.Cut(rest, "/"); ok {
				if instead, ok := unsupportedSandbox[what]; ok {
					writeError(w, http.StatusNotImplemented, fmt.Sprintf("den: %s %s is not supported by den's E2B API: %s", r.Method, p, instead))
					return
				}
			}
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("den: %s %s is not an E2B call den knows (docs/e2b.md lists them)", r.Method, p))
	})
}
