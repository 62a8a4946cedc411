package cloudhypervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/denhq/den/vmm"
)

// apiBase is the path prefix of every endpoint.
const apiBase = "/api/v1/"

// maxResponse bounds what is read of an answer (vm.info with its device
// tree is a few KB).
const maxResponse = 4 << 20

// APIError is an error answer from Cloud Hypervisor: the HTTP status and
// the chain of messages it sent, outermost context first.
type APIError struct {
	// Op is the endpoint without its "vm." prefix ("pause", "vmm.ping").
	Op     string
	Status int
	Chain  []string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("ch %s: %d: %s", e.Op, e.Status, strings.Join(e.Chain, ": "))
}

// invalidStateShapes are the messages by which Cloud Hypervisor refuses an
// operation the VM's state does not allow.
var invalidStateShapes = []string{
	"InvalidStateTransition",
	"already created",
	"while VM is running",
	"VM is not created",
	"VM config is missing",
	"VM is not running",
	"VM is not booted",
}

// Is makes errors.Is(err, vmm.ErrInvalidState) true for refusals due to
// the VM's state (pause twice, create twice, snapshot while running, boot
// before create).
func (e *APIError) Is(target error) bool {
	if target != vmm.ErrInvalidState || e.Status == http.StatusBadRequest {
		return false
	}
	for _, m := range e.Chain {
		for _, s := range invalidStateShapes {
			if strings.Contains(m, s) {
				return true
			}
		}
	}
	return false
}

// NotCreated reports whether the answer says the VMM has no VM.
func (e *APIError) NotCreated() bool {
	return e.Status == http.StatusNotFound
}

// decodeAPIError turns an error answer into an *APIError. Cloud Hypervisor
// sends a JSON array of strings; anything else is kept as one message.
func decodeAPIError(op string, status int, body []byte) *APIError {
	e := &APIError{Op: op, Status: status}
	var chain []string
	if err := json.Unmarshal(body, &chain); err == nil && len(chain) > 0 {
		e.Chain = chain
		return e
	}
	if s := strings.TrimSpace(string(body)); s != "" {
		e.Chain = []string{s}
	} else {
		e.Chain = []string{http.StatusText(status)}
	}
	return e
}

// opName is how an endpoint is named in errors: "vm.pause" -> "pause".
func opName(endpoint string) string {
	return strings.TrimPrefix(endpoint, "vm.")
}

// apiClient speaks HTTP to one API socket. Keep-alives are off: a pooled
// connection to a VMM that went away would fail a PUT that net/http does
// not retry, and a dial per call costs microseconds.
type apiClient struct {
	socket string
	http   *http.Client
}

func newAPIClient(socket string) *apiClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	return &apiClient{socket: socket, http: &http.Client{Transport: tr}}
}

// do sends one request. in, when not nil, is sent as JSON; out, when not
// nil, receives a JSON answer. An error answer is an *APIError; a
// transport failure is returned as it is (without net/http's URL wrapper).
func (c *apiClient) do(ctx context.Context, method, endpoint string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", endpoint, err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+apiBase+endpoint, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeAPIError(opName(endpoint), resp.StatusCode, data)
	}
	if out != nil {
		if len(bytes.TrimSpace(data)) == 0 {
			return fmt.Errorf("%d with an empty body, want JSON", resp.StatusCode)
		}
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode answer: %w", err)
		}
	}
	return nil
}
