package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/denhq/den/ingress"
	"github.com/denhq/den/internal/netlimit"
	"github.com/denhq/den/internal/validate"
	"github.com/denhq/den/machine"
)

// ingressServer serves the VMs' HTTP URLs on --http-listen.
type ingressServer struct {
	srv    *netlimit.HTTP
	h      *ingress.Handler
	url    string // base URL ("" when off)
	domain string
	tls    bool
}

// startIngress listens on o.HTTPListen ("" or "off": no URLs) and serves
// each VM's port there, waking VMs for their requests.
func startIngress(o Options, m URLSessions) (*ingressServer, error) {
	if o.HTTPListen == "" || o.HTTPListen == "off" {
		return &ingressServer{}, nil
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, errors.New("give both --tls-cert and --tls-key, or neither")
	}
	ln, err := net.Listen("tcp", o.HTTPListen)
	if err != nil {
		return nil, fmt.Errorf("%w (choose another with --http-listen ADDR, or off)", err)
	}
	h := &ingress.Handler{Backend: ingressBackend{m}, Domain: o.HTTPDomain, Logger: o.Logger}
	srv := netlimit.NewHTTP("http listener", h, netlimit.Ingress, o.Logger)
	in := &ingressServer{srv: srv, h: h, domain: o.HTTPDomain, tls: o.TLSCert != ""}
	scheme := "http"
	if in.tls {
		scheme = "https"
	}
	in.url = scheme + "://" + ln.Addr().String()
	limited := srv.Listen(ln, !in.tls)
	go func() {
		var err error
		if in.tls {
			err = srv.Server.ServeTLS(limited, o.TLSCert, o.TLSKey)
		} else {
			err = srv.Server.Serve(limited)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.Logger.Error("den: http listener", "err", err)
		}
	}()
	o.Logger.Info("den: vm urls", "listen", in.url, "domain", o.HTTPDomain)
	return in, nil
}

// close stops the listener and ends its connections.
func (in *ingressServer) close() {
	if in.srv != nil {
		_ = in.srv.Server.Close()
		in.srv.Close()
	}
}

// cut closes every connection open through vm's URL (its token changed,
// or it turned private).
func (in *ingressServer) cut(vm string) int {
	if in == nil || in.h == nil {
		return 0
	}
	return in.h.Cut(vm)
}

// vmURL is the URL of a VM's port: by host name with a domain, else by
// path; with the token in it unless public.
func (in *ingressServer) vmURL(vm string, u machine.URLSettings) string {
	if in == nil || in.url == "" {
		return ""
	}
	base, err := url.Parse(in.url)
	if err != nil {
		return ""
	}
	base.Path = "/vm/" + vm + "/"
	if in.domain != "" {
		host := vm + "." + in.domain
		if p := base.Port(); !(p == "80" && base.Scheme == "http") && !(p == "443" && base.Scheme == "https") {
			host = net.JoinHostPort(host, p)
		}
		base.Host, base.Path = host, "/"
	}
	if !u.Public {
		base.RawQuery = "den_token=" + u.Token
	}
	return base.String()
}

// ingressBackend gives the ingress the VMs' URL settings and streams to
// their ports over the agent channel (direct-tcpip), which works the same
// under every VMM and network mode.
type ingressBackend struct{ m URLSessions }

func (b ingressBackend) Lookup(ctx context.Context, vm string) (ingress.Target, error) {
	if validate.VMName(vm) != nil {
		return ingress.Target{}, ingress.ErrNotFound
	}
	u, err := b.m.URLTarget(ctx, vm)
	if errors.Is(err, machine.ErrNotFound) {
		return ingress.Target{}, fmt.Errorf("%w: %w", err, ingress.ErrNotFound)
	}
	if err != nil {
		return ingress.Target{}, err
	}
	return ingress.Target{VM: vm, Port: u.Port, Public: u.Public, Token: u.Token}, nil
}

// Dial wakes or starts the VM and opens a stream to port. The wake is
// not cut by the request's deadline (a wake once started finishes, as
// for every API operation): the ingress bounds the wait itself, and gives
// back the claim of a Dial that comes after it gave up.
func (b ingressBackend) Dial(ctx context.Context, vm string, port int) (net.Conn, func(), error) {
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), OpTimeout)
	defer cancel()
	sess, err := b.m.Open(octx, vm, "")
	if err != nil {
		return nil, nil, err
	}
	sess.NoteURL(port)
	conn, err := dialGuest(sess.Conn, vm, port)
	if err != nil {
		sess.Release()
		return nil, nil, err
	}
	return conn, sess.Release, nil
}

// dialGuest opens a direct-tcpip channel to 127.0.0.1:port in the guest.
func dialGuest(c ssh.Conn, vm string, port int) (net.Conn, error) {
	payload := ssh.Marshal(struct {
		Host     string
		Port     uint32
		OrigHost string
		OrigPort uint32
	}{"127.0.0.1", uint32(port), "127.0.0.1", 0})
	ch, reqs, err := c.OpenChannel("direct-tcpip", payload)
	if err != nil {
		var oce *ssh.OpenChannelError
		if errors.As(err, &oce) && oce.Reason == ssh.ConnectionFailed && strings.Contains(oce.Message, "refused") {
			return nil, fmt.Errorf("port %d in vm %s: %s: %w", port, vm, oce.Message, syscall.ECONNREFUSED)
		}
		return nil, fmt.Errorf("port %d in vm %s: %w", port, vm, err)
	}
	go ssh.DiscardRequests(reqs)
	return &chanConn{Channel: ch, remote: vm + ":" + strconv.Itoa(port)}, nil
}

// chanConn is an SSH channel as a net.Conn (without deadlines: the
// proxy's request context bounds it).
type chanConn struct {
	ssh.Channel
	remote string
}

func (c *chanConn) LocalAddr() net.Addr              { return chanAddr("den") }
func (c *chanConn) RemoteAddr() net.Addr             { return chanAddr(c.remote) }
func (c *chanConn) SetDeadline(time.Time) error      { return nil }
func (c *chanConn) SetReadDeadline(time.Time) error  { return nil }
func (c *chanConn) SetWriteDeadline(time.Time) error { return nil }

// chanAddr names one end of a channel.
type chanAddr string

func (a chanAddr) Network() string { return "ssh" }
func (a chanAddr) String() string  { return string(a) }
