package ingress

import (
	"net"
	"net/http"
	"strings"

	"github.com/denhq/den/internal/validate"
)

// pathPrefix starts the path of a path-routed URL: /vm/<vm>/rest.
const pathPrefix = "/vm/"

// route is where a request goes, and what to take out of it on the way.
type route struct {
	vm   string
	port int
	// root is the VM's URL root: "/" by host, "/vm/<vm>/" by path.
	root string
	// strip is the part of the path that is den's ("/vm/<vm>"), "" by host.
	strip string
	// dropAuth: the Authorization header carried the den token.
	dropAuth bool
	// gen is the VM's generation of streams before the request's token
	// was checked (Handler.Cut).
	gen uint64
}

// route finds the VM r is for; without one it answers r itself (404,
// or the redirect of /vm/<vm> to /vm/<vm>/) and returns false.
func (h *Handler) route(w http.ResponseWriter, r *http.Request) (route, bool) {
	if vm, ok := h.hostVM(r.Host); ok {
		if validate.VMName(vm) != nil {
			h.notFound(w)
			return route{}, false
		}
		return route{vm: vm, root: "/"}, true
	}
	rest, ok := strings.CutPrefix(r.URL.Path, pathPrefix)
	if !ok {
		h.notFound(w)
		return route{}, false
	}
	vm, _, slash := strings.Cut(rest, "/")
	if validate.VMName(vm) != nil {
		h.notFound(w)
		return route{}, false
	}
	root := pathPrefix + vm + "/"
	if !slash {
		u := root
		if r.URL.RawQuery != "" {
			u += "?" + r.URL.RawQuery
		}
		w.Header().Set("Location", u)
		denAnswer(w, "", http.StatusPermanentRedirect)
		return route{}, false
	}
	return route{vm: vm, root: root, strip: pathPrefix + vm}, true
}

// hostVM returns the label before Domain in host (port stripped, any
// case), and whether host is under Domain at all.
func (h *Handler) hostVM(host string) (string, bool) {
	domain := strings.ToLower(strings.Trim(h.Domain, "."))
	if domain == "" {
		return "", false
	}
	if hh, _, err := net.SplitHostPort(host); err == nil {
		host = hh
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	vm, ok := strings.CutSuffix(host, "."+domain)
	return vm, ok
}

// notFound says, in one line, how VM URLs look.
func (h *Handler) notFound(w http.ResponseWriter) {
	msg := "den: no vm here; vm URLs look like /vm/VM/"
	if d := strings.Trim(h.Domain, "."); d != "" {
		msg = "den: no vm here; vm URLs look like http(s)://VM." + strings.ToLower(d) + "/ or /vm/VM/"
	}
	denAnswer(w, msg, http.StatusNotFound)
}
