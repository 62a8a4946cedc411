package ingress

import (
	"crypto/subtle"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// tokenName is the query parameter and the cookie that carry a VM's
// URL token.
const tokenName = "den_token"

// msgUnauthorized is the one answer to a missing or wrong token and to
// an unknown VM alike, so that no one learns the names of others' VMs.
const msgUnauthorized = "den: this URL needs its token (den url VM prints it)"

// authorize checks r's token against t (found: the VM exists) and
// answers 401 when it does not match. A token given in the query is
// answered with a cookie for the VM's URL root.
func (h *Handler) authorize(w http.ResponseWriter, r *http.Request, rt *route, t Target, found bool) bool {
	want := t.Token
	if !found {
		want = ""
	}
	bearer, hasBearer := bearerToken(r)
	if hasBearer && tokenEqual(bearer, want) {
		rt.dropAuth = true
	}
	if found && t.Public {
		return true
	}
	if rt.dropAuth {
		return true
	}
	if q, ok := queryToken(r.URL.RawQuery); ok && tokenEqual(q, want) {
		http.SetCookie(w, &http.Cookie{
			Name: tokenName, Value: q, Path: rt.root,
			HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil,
		})
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			// The token leaves the address bar, the history and every
			// Referer: the cookie carries it from now on.
			u := r.URL.EscapedPath()
			if q := stripQuery(r.URL.RawQuery); q != "" {
				u += "?" + q
			}
			w.Header().Set("Location", u)
			denAnswer(w, "", http.StatusSeeOther)
			return false
		}
		return true
	}
	for _, c := range r.Cookies() {
		if c.Name == tokenName && tokenEqual(c.Value, want) {
			return true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="den"`)
	denAnswer(w, msgUnauthorized, http.StatusUnauthorized)
	return false
}

// denAnswer is den's own answer (not a VM's): a line of text, or none,
// sent with no Referer to follow it.
func denAnswer(w http.ResponseWriter, msg string, code int) {
	w.Header().Set("Referrer-Policy", "no-referrer")
	if msg == "" {
		w.WriteHeader(code)
		return
	}
	http.Error(w, msg, code)
}

// referer is what of r's Referer the VM rt may see: none when it names
// another VM's URL (path URLs share one origin, so the browser sends it
// along), else the Referer without den_token in its query.
func (h *Handler) referer(ref, reqHost string, rt *route) (string, bool) {
	u, err := url.Parse(ref)
	if err != nil || ref == "" {
		return "", false
	}
	vm, byHost := h.hostVM(u.Host)
	if !byHost {
		vm = ""
		if strings.EqualFold(u.Host, reqHost) {
			if rest, ok := strings.CutPrefix(u.Path, pathPrefix); ok {
				vm, _, _ = strings.Cut(rest, "/")
			}
		}
	}
	if vm != "" && vm != rt.vm {
		return "", false
	}
	if _, ok := queryToken(u.RawQuery); ok {
		u.RawQuery = stripQuery(u.RawQuery)
		u.ForceQuery = false
		ref = u.String()
	}
	return ref, true
}

// keepSetCookie filters a VM's Set-Cookie lines: it drops den's own
// cookie name, a Domain other than the request's host (a cookie for the
// parent domain would reach every VM's host), and a Path outside the
// VM's URL root (path URLs share one host). It returns what it dropped.
func keepSetCookie(hdr http.Header, reqHost string, rt route) (dropped []string) {
	lines := hdr.Values("Set-Cookie")
	if len(lines) == 0 {
		return nil
	}
	host := reqHost
	if hh, _, err := net.SplitHostPort(reqHost); err == nil {
		host = hh
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	var keep []string
	for _, line := range lines {
		if cookieAllowed(line, host, rt.root) {
			keep = append(keep, line)
		} else {
			name, _, _ := strings.Cut(line, "=")
			dropped = append(dropped, strings.TrimSpace(name))
		}
	}
	hdr.Del("Set-Cookie")
	for _, line := range keep {
		hdr.Add("Set-Cookie", line)
	}
	return dropped
}

func cookieAllowed(line, host, root string) bool {
	c, err := http.ParseSetCookie(line)
	if err != nil || strings.EqualFold(c.Name, tokenName) {
		return false
	}
	if d := strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(c.Domain), "."), "."); d != "" && d != host {
		return false
	}
	if root == "/" || c.Path == "" {
		return true // a default path is under the page's own
	}
	return c.Path == strings.TrimSuffix(root, "/") || strings.HasPrefix(c.Path, root)
}

// tokenEqual compares a given token with the VM's in constant time; an
// empty token never matches.
func tokenEqual(given, want string) bool {
	ok := subtle.ConstantTimeCompare([]byte(given), []byte(want)) == 1
	return ok && want != ""
}

// bearerToken returns the token of "Authorization: Bearer T".
func bearerToken(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// queryToken returns the den_token parameter of a raw query.
func queryToken(rawQuery string) (string, bool) {
	for _, kv := range strings.Split(rawQuery, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); err != nil || k != tokenName {
			continue
		}
		if v, err := url.QueryUnescape(v); err == nil {
			return v, true
		}
	}
	return "", false
}

// stripQuery takes the den_token parameters out of a raw query and
// leaves the others as they were written.
func stripQuery(rawQuery string) string {
	if rawQuery == "" {
		return ""
	}
	var keep []string
	for _, kv := range strings.Split(rawQuery, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); err == nil && k == tokenName {
			continue
		}
		keep = append(keep, kv)
	}
	return strings.Join(keep, "&")
}

// stripCookie takes the den_token cookies out of h's Cookie headers and
// leaves the others as they were written.
func stripCookie(h http.Header) {
	var out []string
	for _, line := range h.Values("Cookie") {
		var keep []string
		for _, part := range strings.Split(line, ";") {
			name, _, _ := strings.Cut(strings.TrimSpace(part), "=")
			if name == tokenName {
				continue
			}
			if p := strings.TrimSpace(part); p != "" {
				keep = append(keep, p)
			}
		}
		if len(keep) > 0 {
			out = append(out, strings.Join(keep, "; "))
		}
	}
	h.Del("Cookie")
	for _, line := range out {
		h.Add("Cookie", line)
	}
}
