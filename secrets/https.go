package secrets

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// KindHTTPS is a token for HTTPS requests: VMs granted it hold a
// placeholder (Placeholder), and den puts the value in its place in the
// named header or query parameter of their requests to its hosts.
const KindHTTPS = "https"

// Placeholder is what a VM holds of an HTTPS secret: den replaces it in
// the VM's requests to the secret's hosts.
func Placeholder(name string) string { return "den-secret:" + name }

// HTTPS is a new HTTPS secret: where it goes and what it is.
type HTTPS struct {
	// Hosts are the names it goes to (exact names, lower case).
	Hosts []string
	// Header or Query (one of them) names where its placeholder is
	// replaced: a request header (Authorization), a query parameter.
	Header, Query string
	// Env is the environment variable holding the placeholder in the
	// VM's sessions ("": the name in upper case, '-' and '.' as '_').
	Env string
}

var (
	envRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	hostRE = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// reservedEnv are variables a session needs as they are.
var reservedEnv = map[string]bool{"PATH": true, "HOME": true, "USER": true, "LOGNAME": true, "SHELL": true,
	"TERM": true, "SSH_AUTH_SOCK": true, "NODE_EXTRA_CA_CERTS": true, "PWD": true, "IFS": true}

// EnvOf is the default environment variable of an HTTPS secret.
func EnvOf(name string) string {
	return strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
}

// AddHTTPS stores a new HTTPS secret.
func (s *Store) AddHTTPS(owner, name string, value []byte, h HTTPS) (Secret, error) {
	if err := check(owner, name); err != nil {
		return Secret{}, err
	}
	if err := h.check(name); err != nil {
		return Secret{}, fmt.Errorf("secret %q: %w", name, err)
	}
	value = oneLine(value)
	if err := headerValue(value); err != nil {
		return Secret{}, fmt.Errorf("secret %q: %w", name, err)
	}
	now := time.Now().UTC()
	r := record{Secret: Secret{Name: name, Owner: owner, Kind: KindHTTPS, Hosts: h.Hosts, Header: h.Header,
		Query: h.Query, Env: h.Env, Created: now, Updated: now}, Value: value}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(s.path(owner, name)); err == nil {
		return Secret{}, fmt.Errorf("secret %q: %w (den secrets set changes its value)", name, ErrExists)
	}
	if err := s.write(r); err != nil {
		return Secret{}, err
	}
	s.https.Store(true)
	return r.Secret, nil
}

// AnyHTTPS says whether the store holds an HTTPS secret (of anyone's),
// without reading it: a flag its writes keep.
func (s *Store) AnyHTTPS() bool { return s.https.Load() }

// holdsHTTPS reads every secret to find an HTTPS one (true when one
// cannot be read: it may be).
func (s *Store) holdsHTTPS() bool {
	l, err := s.List("")
	if err != nil {
		return true
	}
	return slices.ContainsFunc(l, func(sec Secret) bool { return sec.Kind == KindHTTPS })
}

// GrantedHTTPS are the HTTPS secrets granted to vm, without their
// values, by environment variable.
func (s *Store) GrantedHTTPS(vm VMRef) ([]Secret, error) {
	rs, err := s.granted(vm, KindHTTPS)
	if err != nil {
		return nil, err
	}
	out := make([]Secret, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Secret)
	}
	slices.SortFunc(out, func(a, b Secret) int { return strings.Compare(a.Env, b.Env) })
	return out, nil
}

// check checks h and makes it canonical.
func (h *HTTPS) check(name string) error {
	if len(h.Hosts) == 0 {
		return fmt.Errorf("name the hosts it goes to (--host api.example.com): %w", ErrInvalid)
	}
	var hosts []string
	for _, host := range h.Hosts {
		host = strings.ToLower(strings.TrimSuffix(host, "."))
		if len(host) > 253 || !hostRE.MatchString(host) {
			return fmt.Errorf("bad host %q: a DNS name (api.example.com), no port, no wildcard: %w", host, ErrInvalid)
		}
		if !slices.Contains(hosts, host) {
			hosts = append(hosts, host)
		}
	}
	h.Hosts = hosts
	switch {
	case (h.Header == "") == (h.Query == ""):
		return fmt.Errorf("name one header (--header Authorization) or one query parameter (--query key) for it: %w", ErrInvalid)
	case h.Header != "" && !httpguts.ValidHeaderFieldName(h.Header):
		return fmt.Errorf("bad header name %q: %w", h.Header, ErrInvalid)
	case h.Header != "":
		h.Header = http.CanonicalHeaderKey(h.Header)
		if h.Header == "Host" {
			return fmt.Errorf("the Host header cannot carry a secret: %w", ErrInvalid)
		}
	case len(h.Query) > 256 || strings.ContainsAny(h.Query, "&=#") || strings.TrimSpace(h.Query) != h.Query:
		return fmt.Errorf("bad query parameter %q: %w", h.Query, ErrInvalid)
	}
	if h.Env == "" {
		h.Env = EnvOf(name)
	}
	if !envRE.MatchString(h.Env) {
		return fmt.Errorf("bad environment variable %q: letters, digits and '_', not starting with a digit: %w", h.Env, ErrInvalid)
	}
	if reservedEnv[h.Env] || strings.HasPrefix(h.Env, "LD_") || strings.HasPrefix(h.Env, "DEN_") {
		return fmt.Errorf("environment variable %s is the system's or den's: choose another (--env): %w", h.Env, ErrInvalid)
	}
	return nil
}

// oneLine is an HTTPS secret's value without the line end a file or an
// echo leaves.
func oneLine(v []byte) []byte {
	v = bytes.TrimSuffix(v, []byte("\n"))
	return bytes.TrimSuffix(v, []byte("\r"))
}

// headerValue checks an HTTPS secret's value: text a header may carry.
func headerValue(v []byte) error {
	if !httpguts.ValidHeaderFieldValue(string(v)) || strings.TrimSpace(string(v)) != string(v) {
		return fmt.Errorf("an https secret's value is one line of text, without leading or trailing blanks: %w", ErrInvalid)
	}
	return nil
}

// forHost says whether the secret goes to host.
func (r record) forHost(host string) bool {
	return r.Kind == KindHTTPS && slices.Contains(r.Hosts, host)
}

// placeholderRE finds placeholders: den-secret: and a secret's name,
// whole (den-secret:api-v2 is not den-secret:api).
var placeholderRE = regexp.MustCompile(`den-secret:[A-Za-z][A-Za-z0-9_.-]{0,63}`)

// replace is s with the value in place of each of the secret's
// placeholders, and whether there was one.
func (r record) replace(s string) (string, bool) {
	ph, done := Placeholder(r.Name), false
	out := placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
		if m != ph {
			return m
		}
		done = true
		return string(r.Value)
	})
	return out, done
}

// substitute puts the secret's value in place of its placeholder in the
// request's header or query parameter; it says whether it did.
func (r record) substitute(req *http.Request) bool {
	done := false
	if r.Header != "" {
		vals := req.Header[r.Header]
		for i, v := range vals {
			if nv, ok := r.replace(v); ok {
				vals[i], done = nv, true
			}
		}
		return done
	}
	// The parameter's own values only: the query's other parts keep
	// their bytes.
	parts := strings.Split(req.URL.RawQuery, "&")
	for i, part := range parts {
		k, v, _ := strings.Cut(part, "=")
		if key, err := url.QueryUnescape(k); err != nil || key != r.Query {
			continue
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			continue
		}
		if nv, ok := r.replace(val); ok {
			parts[i] = k + "=" + url.QueryEscape(nv)
			done = true
		}
	}
	if done {
		req.URL.RawQuery = strings.Join(parts, "&")
	}
	return done
}
