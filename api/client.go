package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Client talks to a den daemon: over its unix socket, where the daemon
// knows the caller from the connection, or over its TLS listener with a
// bearer token (NewRemoteClient).
type Client struct {
	where string // the daemon, for messages
	dial  func(ctx context.Context) (net.Conn, error)
	token string
	// header goes with every request (WithHeader).
	header http.Header
	http   *http.Client
}

// WithHeader returns a client that sends header key: value with every
// request, sharing c's connections.
func (c *Client) WithHeader(key, value string) *Client {
	n := *c
	n.header = c.header.Clone()
	if n.header == nil {
		n.header = http.Header{}
	}
	n.header.Set(key, value)
	return &n
}

// NewClient returns a client for the daemon at socket ($DEN_SOCKET or
// DefaultSocket when empty).
func NewClient(socket string) *Client {
	if socket == "" {
		socket = os.Getenv("DEN_SOCKET")
	}
	if socket == "" {
		socket = DefaultSocket
	}
	return NewDialClient(socket, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socket)
		if err != nil {
			// One line: the cause, then the kind (errors.Join would add a
			// line break).
			return nil, fmt.Errorf("connect to den daemon at %s (is `den daemon` running? set DEN_SOCKET): %w: %w", socket, err, ErrNoDaemon)
		}
		return conn, nil
	})
}

// NewRemoteClient returns a client for the daemon's TLS API listener at
// addr (host:port, or an https:// URL) that authenticates with token.
// tlsConfig may be nil (the system's roots verify the daemon).
func NewRemoteClient(addr, token string, tlsConfig *tls.Config) (*Client, error) {
	hostport := addr
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("den api url %q: want https://HOST:PORT", addr)
		}
		hostport = u.Host
	}
	if _, _, err := net.SplitHostPort(hostport); err != nil {
		return nil, fmt.Errorf("den api address %q: want HOST:PORT or https://HOST:PORT", addr)
	}
	if token == "" {
		return nil, errors.New("den api at " + addr + ": no token (den tokens add, then DEN_TOKEN)")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if tlsConfig != nil {
		cfg = tlsConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(hostport)
	}
	c := NewDialClient("https://"+hostport, func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: cfg}
		conn, err := d.DialContext(ctx, "tcp", hostport)
		if err != nil {
			return nil, fmt.Errorf("connect to den daemon at %s: %w: %w", hostport, err, ErrNoDaemon)
		}
		return conn, nil
	})
	c.token = token
	return c, nil
}

// NewDialClient returns a client whose connections to the daemon come
// from dial (TLS, if any, done by dial); where names the daemon in
// messages. The SSH gateway uses it to call the API in-process.
func NewDialClient(where string, dial func(ctx context.Context) (net.Conn, error)) *Client {
	c := &Client{where: where, dial: dial}
	c.http = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return c.dial(ctx)
		},
		MaxIdleConns: 4,
	}}
	return c
}

// CloseIdle closes the client's idle connections to the daemon: a
// client made for one request (the daemon's MCP handler makes one per
// request) leaves none open after it.
func (c *Client) CloseIdle() { c.http.CloseIdleConnections() }

// Socket is the daemon this client uses: its socket, or its URL.
func (c *Client) Socket() string { return c.where }

// authorize adds the client's credentials to req.
func (c *Client) authorize(req *http.Request) {
	for k, v := range c.header {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
}

// do sends a JSON request and decodes a JSON answer into out (if not nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: bad answer: %w", method, path, err)
	}
	return nil
}

// send performs a request and turns an error answer into *Error.
func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://den"+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req)
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	var eb ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
		eb.Error = fmt.Sprintf("daemon answered %s: %s", resp.Status, strings.TrimSpace(string(data)))
	}
	return &Error{Status: resp.StatusCode, Code: eb.Code, Message: eb.Error}
}

// Info describes the daemon.
func (c *Client) Info(ctx context.Context) (DaemonInfo, error) {
	var info DaemonInfo
	err := c.do(ctx, http.MethodGet, "/v1/info", nil, &info)
	return info, err
}

// CreateVM creates a VM, calling progress (if not nil) for each step.
func (c *Client) CreateVM(ctx context.Context, req CreateRequest, progress func(Event)) (VM, error) {
	return c.stream(ctx, http.MethodPost, "/v1/vms", req, progress)
}

// stream sends a request whose answer is a stream of Events, and returns
// the VM of the final event.
func (c *Client) stream(ctx context.Context, method, path string, in any, progress func(Event)) (VM, error) {
	ev, err := c.streamEvent(ctx, method, path, in, progress)
	if err != nil {
		return VM{}, err
	}
	if ev.VM == nil {
		return VM{}, &Error{Status: http.StatusInternalServerError, Code: "internal", Message: fmt.Sprintf("%s %s: the daemon's final answer has no vm", method, path)}
	}
	return *ev.VM, nil
}

// maxEventLine bounds one line of a stream: a diff's result, with its
// patches (16 MiB at most, escaped) and a line per changed path, is one.
const maxEventLine = 256 << 20

// streamEvent returns the final event (with a VM or a Checkpoint) of a
// streamed answer, passing progress events on. An error answer before the
// stream, the error that ends it, and a stream that ends without its
// final event are all errors.
func (c *Client) streamEvent(ctx context.Context, method, path string, in any, progress func(Event)) (Event, error) {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return Event{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxEventLine)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return Event{}, fmt.Errorf("%s %s: bad event from the daemon: %w", method, path, err)
		}
		switch {
		case ev.Error != "":
			return Event{}, streamError(ev)
		case ev.Done || ev.VM != nil || ev.Checkpoint != nil:
			return ev, nil
		case progress != nil:
			progress(ev)
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return Event{}, fmt.Errorf("%s %s: %w (the operation goes on in the daemon)", method, path, ctx.Err())
		}
		return Event{}, &Error{Status: http.StatusInternalServerError, Code: "internal",
			Message: fmt.Sprintf("%s %s: the daemon's answer broke off before its final result (%v): see den ls for how the operation ended", method, path, err)}
	}
	return Event{}, &Error{Status: http.StatusInternalServerError, Code: "internal",
		Message: fmt.Sprintf("%s %s: the daemon's answer ended before its final result: see den ls for how the operation ended", method, path)}
}

// streamError is the error that ended a stream.
func streamError(ev Event) error {
	code := ev.Code
	if _, ok := Codes[code]; !ok {
		code = "internal"
	}
	return &Error{Status: Codes[code].Status, Code: ev.Code, Message: ev.Error}
}

// ListVMs lists the VMs.
func (c *Client) ListVMs(ctx context.Context) ([]VM, error) {
	var vms []VM
	err := c.do(ctx, http.MethodGet, "/v1/vms", nil, &vms)
	return vms, err
}

// GetVM returns one VM.
func (c *Client) GetVM(ctx context.Context, name string) (VM, error) {
	var vm VM
	err := c.do(ctx, http.MethodGet, "/v1/vms/"+url.PathEscape(name), nil, &vm)
	return vm, err
}

// RemoveVM deletes a VM and its disk; force stops a running one.
func (c *Client) RemoveVM(ctx context.Context, name string, force bool) error {
	q := ""
	if force {
		q = "?force=1"
	}
	return c.do(ctx, http.MethodDelete, "/v1/vms/"+url.PathEscape(name)+q, nil, nil)
}

// Logs returns the VMM and console logs of a VM.
func (c *Client) Logs(ctx context.Context, name string, w io.Writer) error {
	resp, err := c.send(ctx, http.MethodGet, "/v1/vms/"+url.PathEscape(name)+"/logs", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// SSH opens an SSH connection to a VM through the daemon: the daemon
// relays its sessions, port forwards and sftp to the VM's guest agent,
// waking the VM first if it sleeps.
func (c *Client) SSH(ctx context.Context, name string) (*ssh.Client, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Minute))
	}
	// ctx ending cuts the upgrade and the handshake short.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	req, _ := http.NewRequest(http.MethodPost, "http://den/v1/vms/"+url.PathEscape(name)+"/ssh", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", UpgradeSSH)
	c.authorize(req)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("ssh %s: %w", name, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ssh %s: %w", name, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, decodeError(resp)
	}
	bc := &bufferedConn{Conn: conn, r: br}
	sc, chans, reqs, err := ssh.NewClientConn(bc, "den/"+name, &ssh.ClientConfig{
		User:            name,
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), // the daemon itself, reached by its socket or TLS
		Timeout:         time.Minute,
	})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ssh %s: %w", name, err)
	}
	if !stop() {
		sc.Close()
		return nil, fmt.Errorf("ssh %s: %w", name, ctx.Err())
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(sc, chans, reqs), nil
}

// UpgradeSSH is the Upgrade protocol of POST /v1/vms/NAME/ssh.
const UpgradeSSH = "den-ssh"

// bufferedConn reads first what the HTTP reader buffered.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }
