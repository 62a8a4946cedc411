package ingress

import (
	"crypto/subtle"
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
		return true
	}
	for _, c := range r.Cookies() {
		if c.Name == tokenName && tokenEqual(c.Value, want) {
			return true
		}
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="den"`)
	http.Error(w, msgUnauthorized, http.StatusUnauthorized)
	return false
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
