package secrets

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/egress"
	"github.com/denhq/den/network"
)

// InterceptorConfig configures an Interceptor.
type InterceptorConfig struct {
	// VM is the identity of a VM by name (its creation time): a VM whose
	// record cannot be read gets nothing.
	VM func(name string) (VMRef, error)
	// Roots are the authorities den trusts for the real hosts (nil: the
	// system's).
	Roots *x509.CertPool
	// Note hears of every request that carried a secret, or a
	// placeholder den did not replace.
	Note func(Use)
	// Logger gets what the interceptor does (slog.Default() if nil).
	Logger *slog.Logger
}

// Interceptor takes over VMs' HTTPS connections to the hosts of the
// HTTPS secrets granted to them (a network.Interceptor): it ends their
// TLS with the VM's CA, puts each granted secret's value in place of its
// placeholder in the request, and sends it on over TLS verified against
// the real host's certificate. Grants and values are read at every
// request.
type Interceptor struct {
	s   *Store
	cfg InterceptorConfig
	log *slog.Logger

	mu  sync.Mutex
	vms map[string]*intercepted
	// seen are, per VM, the names answered with its interceptor: their
	// connections are taken (and sent on without a value) after a
	// revoke too, while the guest may still hold the answer.
	seen map[string]map[string]bool
}

// Bounds of the interceptor.
const (
	maxSeen        = 256
	dialTimeout    = 10 * time.Second
	headerTimeout  = 30 * time.Second
	idleTimeout    = 2 * time.Minute
	handshakeLimit = 10 * time.Second
)

// NewInterceptor makes an interceptor serving no VM yet.
func (s *Store) NewInterceptor(cfg InterceptorConfig) *Interceptor {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Note == nil {
		cfg.Note = func(Use) {}
	}
	return &Interceptor{s: s, cfg: cfg, log: log, vms: map[string]*intercepted{}, seen: map[string]map[string]bool{}}
}

// granted are the HTTPS secrets granted to vm that go to host.
func (ix *Interceptor) granted(vm, host string) (VMRef, []record) {
	ref, err := ix.cfg.VM(vm)
	if err != nil {
		return ref, nil
	}
	rs, err := ix.s.granted(ref, KindHTTPS)
	if err != nil {
		ix.log.Warn("den: https secrets of a vm", "vm", vm, "err", err)
		return ref, nil
	}
	var out []record
	for _, r := range rs {
		if r.forHost(host) {
			out = append(out, r)
		}
	}
	return ref, out
}

// Intercepts says whether an HTTPS secret granted to vm goes to name
// (and vm is served: its connections have somewhere to go).
func (ix *Interceptor) Intercepts(vm, name string) bool {
	ix.mu.Lock()
	served := ix.vms[vm] != nil
	ix.mu.Unlock()
	if !served {
		return false
	}
	if _, rs := ix.granted(vm, name); len(rs) == 0 {
		return false
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	seen := ix.seen[vm]
	if seen == nil || len(seen) >= maxSeen {
		seen = map[string]bool{}
		ix.seen[vm] = seen
	}
	seen[name] = true
	return true
}

// takes says whether the interceptor ends TLS for host on vm's behalf.
func (ix *Interceptor) takes(vm, host string) bool {
	ix.mu.Lock()
	seen := ix.seen[vm][host]
	ix.mu.Unlock()
	return seen || ix.Intercepts(vm, host)
}

// intercepted is one VM's listener.
type intercepted struct {
	ix  *Interceptor
	vm  string
	srv *http.Server
	rp  *httputil.ReverseProxy

	mu    sync.Mutex
	ca    *CA
	certs map[string]*tls.Certificate
}

// Serve listens for vm's intercepted connections on addr, from guest
// only, on a socket marked network.InterceptMark, in place of its
// listener before; resolve says where den may connect for it.
func (ix *Interceptor) Serve(vm string, addr netip.AddrPort, guest netip.Addr, resolve func(ctx context.Context, name string) ([]netip.Addr, error)) error {
	ix.Stop(vm)
	lc := net.ListenConfig{Control: func(nw, address string, c syscall.RawConn) error {
		if err := egress.Freebind(nw, address, c); err != nil {
			return err
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, network.InterceptMark)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set SO_MARK: %w", serr)
		}
		return nil
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", addr.String())
	if err != nil {
		return fmt.Errorf("https interceptor for vm %s: %w", vm, err)
	}
	ln = fromOnly{ln, guest.Unmap()}
	v := &intercepted{ix: ix, vm: vm, certs: map[string]*tls.Certificate{}}
	dialer := &net.Dialer{Timeout: dialTimeout}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, hostport string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(hostport)
			if err != nil {
				return nil, err
			}
			addrs, err := resolve(ctx, host)
			if err != nil {
				return nil, err
			}
			var errs []error
			for _, a := range addrs {
				c, err := dialer.DialContext(ctx, "tcp4", net.JoinHostPort(a.String(), port))
				if err == nil {
					return c, nil
				}
				errs = append(errs, err)
			}
			return nil, errors.Join(errs...)
		},
		TLSClientConfig:       &tls.Config{RootCAs: ix.cfg.Roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   handshakeLimit,
		IdleConnTimeout:       idleTimeout,
		MaxIdleConnsPerHost:   4,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	v.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = pr.In.TLS.ServerName
			pr.Out.Host = pr.In.Host
		},
		Transport:    tr,
		ErrorLog:     slog.NewLogLogger(ix.log.Handler(), slog.LevelDebug),
		ErrorHandler: v.failed,
		ModifyResponse: func(resp *http.Response) error {
			v.used(resp.Request, fmt.Sprint(resp.StatusCode), nil)
			return nil
		},
	}
	v.srv = &http.Server{
		Handler: v,
		// No session resumption: every connection's handshake asks
		// GetCertificate, which checks the name it is for.
		TLSConfig:         &tls.Config{GetCertificate: v.certificate, MinVersion: tls.VersionTLS12, SessionTicketsDisabled: true},
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(ix.log.Handler(), slog.LevelDebug),
	}
	ix.mu.Lock()
	ix.vms[vm] = v
	ix.mu.Unlock()
	go func() {
		if err := v.srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ix.log.Warn("den: https interceptor ended", "vm", vm, "err", err)
		}
		tr.CloseIdleConnections()
	}()
	return nil
}

// Stop closes vm's listener and its connections.
func (ix *Interceptor) Stop(vm string) {
	ix.mu.Lock()
	v := ix.vms[vm]
	delete(ix.vms, vm)
	delete(ix.seen, vm)
	ix.mu.Unlock()
	if v != nil {
		v.srv.Close()
	}
}

// Close stops every VM.
func (ix *Interceptor) Close() {
	ix.mu.Lock()
	vms := ix.vms
	ix.vms = map[string]*intercepted{}
	ix.mu.Unlock()
	for _, v := range vms {
		v.srv.Close()
	}
}

// fromOnly accepts connections from one address and closes the others
// (the host's own processes may reach the gateway address too).
type fromOnly struct {
	net.Listener
	from netip.Addr
}

func (l fromOnly) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil && ap.Addr().Unmap() == l.from {
			return c, nil
		}
		c.Close()
	}
}

// name is the host a connection's TLS named, lower case without a
// trailing dot, "" if it is not a host name.
func name(serverName string) string {
	host := strings.ToLower(strings.TrimSuffix(serverName, "."))
	if len(host) > 253 || !hostRE.MatchString(host) {
		return ""
	}
	return host
}

// certificate is the certificate for the name the VM asks for, signed by
// its CA; names den does not take are refused.
func (v *intercepted) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	host := name(hello.ServerName)
	if host == "" || !v.ix.takes(v.vm, host) {
		return nil, fmt.Errorf("den takes no https for %q from vm %s", host, v.vm)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if c := v.certs[host]; c != nil && time.Until(c.Leaf.NotAfter) > leafValidity/2 {
		return c, nil
	}
	if v.ca == nil {
		ref, err := v.ix.cfg.VM(v.vm)
		if err != nil {
			return nil, err
		}
		if v.ca, err = v.ix.s.VMCA(ref); err != nil {
			return nil, err
		}
	}
	c, err := v.ca.leaf(host)
	if err != nil {
		return nil, err
	}
	if len(v.certs) >= maxSeen {
		clear(v.certs)
	}
	v.certs[host] = c
	return c, nil
}

// usesKey carries the secrets a request carries, for the answer's note.
type usesKey struct{}

type uses struct {
	host    string
	secrets []record
	stray   string // a placeholder left as it is
}

// ServeHTTP sends one request of the VM on, with the values of the
// secrets granted to it for its host.
func (v *intercepted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host := name(r.TLS.ServerName)
	if host == "" || !v.ix.takes(v.vm, host) {
		http.Error(w, fmt.Sprintf("den: no https for %q from this vm", r.TLS.ServerName), http.StatusMisdirectedRequest)
		return
	}
	reqHost := r.Host
	if h, _, err := net.SplitHostPort(r.Host); err == nil {
		reqHost = h
	}
	if !strings.EqualFold(strings.TrimSuffix(reqHost, "."), host) {
		http.Error(w, fmt.Sprintf("den: the request is for %q on a connection to %q", reqHost, host), http.StatusMisdirectedRequest)
		return
	}
	_, rs := v.ix.granted(v.vm, host)
	u := &uses{host: host}
	for _, rec := range rs {
		if rec.substitute(r) {
			u.secrets = append(u.secrets, rec)
		}
	}
	u.stray = placeholderRE.FindString(r.URL.RawQuery)
	for _, vals := range r.Header {
		for _, val := range vals {
			if u.stray == "" {
				u.stray = placeholderRE.FindString(val)
			}
		}
	}
	v.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), usesKey{}, u)))
}

// failed answers a request den could not send on.
func (v *intercepted) failed(w http.ResponseWriter, r *http.Request, err error) {
	v.used(r, "", err)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintf(w, "den: %s: %v\n", r.URL.Host, err)
}

// used notes the secrets a request carried, with the answer's status or
// the error.
func (v *intercepted) used(r *http.Request, status string, err error) {
	u, _ := r.Context().Value(usesKey{}).(*uses)
	if u == nil {
		return
	}
	dest := r.Method + " https://" + u.host + r.URL.Path
	if status != "" {
		dest += ": " + status
	}
	if err != nil {
		err = fmt.Errorf("failed: %w", err)
	}
	for _, rec := range u.secrets {
		v.ix.cfg.Note(Use{VM: v.vm, Owner: rec.Owner, Secret: rec.Name, Kind: KindHTTPS, Dest: dest, Err: err})
	}
	if u.stray != "" {
		secret := strings.TrimPrefix(u.stray, Placeholder(""))
		v.ix.cfg.Note(Use{VM: v.vm, Secret: secret, Kind: KindHTTPS, Dest: dest,
			Err: fmt.Errorf("%s went as it is: vm %s has no grant of it for %s", u.stray, v.vm, u.host)})
	}
}
