package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/e2b"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/users"
)

// e2bListener serves E2B's API (--e2b-listen): plain HTTP on a loopback
// address, TLS (--api-listen's certificate options) on any other.
type e2bListener struct {
	srv  *http.Server
	ln   net.Listener
	addr string
	tls  bool
}

// startE2B listens on o.E2BListen ("" or "off": none) and serves E2B's
// control plane and envd there, each request acting as the user of the
// den token it carries, through in-process connections to this API.
func startE2B(ctx context.Context, o Options, state machine.StateDir, tokens users.Tokens, inproc *inProcess, log *slog.Logger) (*e2bListener, error) {
	if o.E2BListen == "" || o.E2BListen == "off" {
		return &e2bListener{}, nil
	}
	dial := func(c Caller) *api.Client {
		return api.NewDialClient("the den daemon", func(ctx context.Context) (net.Conn, error) {
			return inproc.dial(ctx, c)
		})
	}
	ln, err := net.Listen("tcp", o.E2BListen)
	if err != nil {
		return nil, fmt.Errorf("e2b listener: %w (choose another with --e2b-listen ADDR, or off)", err)
	}
	srv, err := e2b.New(e2b.Config{
		Authenticate: func(ctx context.Context, key string) (*api.Client, string, error) {
			tok, err := tokens.Verify(ctx, key)
			if err != nil {
				return nil, "", fmt.Errorf("e2b: %w", api.ErrUnauthenticated)
			}
			return dial(Caller{User: tok.User, Admin: tok.Admin, Source: "e2b " + tok.ID, Token: tok.ID}), tok.User, nil
		},
		As:      func(user string) *api.Client { return dial(Caller{User: user, Source: "e2b server"}) },
		Records: filepath.Join(state.Path(), "e2b.json"),
		Domain:  e2bDomain(o.E2BDomain, ln.Addr()),
		Logger:  log,
	})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("e2b listener: %w", err)
	}
	l := &e2bListener{ln: ln, addr: ln.Addr().String()}
	if host, _, _ := net.SplitHostPort(o.E2BListen); !isLoopback(host) {
		cfg, err := e2bTLS(o, state, e2bDomain(o.E2BDomain, ln.Addr()))
		if err != nil {
			ln.Close()
			return nil, err
		}
		l.ln, l.tls = tls.NewListener(ln, cfg), true
	}
	l.srv = &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go srv.Run(ctx)
	go func() {
		if err := l.srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("den: e2b listener", "err", err)
		}
	}()
	log.Info("den: e2b listener", "addr", l.addr, "tls", l.tls)
	return l, nil
}

// e2bDomain is the domain of sandboxes' host names: the one given, or
// for a loopback listener localhost and its port (browsers and curl
// resolve every name under localhost to the loopback address); else
// none.
func e2bDomain(given string, addr net.Addr) string {
	if given != "" {
		return given
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil || !isLoopback(host) {
		return ""
	}
	return net.JoinHostPort("localhost", port)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// e2bTLS is the TLS configuration of a non-loopback E2B listener: the
// --api-tls-cert and --api-tls-key files, or a self-signed certificate
// of its own, for its address and, with a domain, the sandboxes' host
// names (*.DOMAIN: PORT-ID.DOMAIN is one label under it), made anew when
// the one kept lacks them.
func e2bTLS(o Options, state machine.StateDir, domain string) (*tls.Config, error) {
	certFile, keyFile := o.APITLSCert, o.APITLSKey
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("e2b listener: give both --api-tls-cert and --api-tls-key, or neither (a self-signed certificate)")
	}
	if certFile == "" {
		certFile, keyFile = state.E2BCert(), state.E2BKey()
		var names []string
		if domain != "" {
			if host, _, err := net.SplitHostPort(domain); err == nil {
				domain = host
			}
			names = []string{domain, "*." + domain}
		}
		// The kept certificate must hold these names and the listener's
		// address, which may have changed: one that does not is made anew.
		need := names
		if host, _, err := net.SplitHostPort(o.E2BListen); err == nil {
			if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
				need = append(need[:len(need):len(need)], host)
			}
		}
		if !covers(certFile, need) {
			_ = os.Remove(certFile)
		}
		if err := selfSigned(certFile, keyFile, o.E2BListen, names...); err != nil {
			return nil, fmt.Errorf("e2b listener: %w", err)
		}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("e2b listener: certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// url is the listener's base URL ("" when off): what E2B_API_URL and
// E2B_SANDBOX_URL take.
func (l *e2bListener) url() string {
	switch {
	case l.addr == "":
		return ""
	case l.tls:
		return "https://" + l.addr
	}
	return "http://" + l.addr
}

func (l *e2bListener) close() {
	if l.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = l.srv.Shutdown(ctx)
		_ = l.srv.Close()
	}
}
