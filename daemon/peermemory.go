package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/denhq/den/machine"
)

// peerMemoryPath is where a host's peer listener serves its local copies
// of sleeping VMs' memory to the other hosts of its cluster, which are
// its only callers (machine.LocalMemory). It is not part of the API.
const peerMemoryPath = "/peer/v1/memory"

// peerMemoryAnswer bounds the wait for a host's answer to a request for
// memory: one that does not answer by then (frozen, cut off) is passed
// over for the volume.
const peerMemoryAnswer = 3 * time.Second

// serveMemory answers a peer's request for extents of a local copy of
// memory: the extents' bytes, back to back, or an error before any.
func serveMemory(w http.ResponseWriter, r *http.Request, mem machine.LocalMemory, from string) {
	if r.Method != http.MethodPost {
		writeError(w, fmt.Errorf("peer %q: %s %s: %w", from, r.Method, r.URL.Path, machine.ErrInvalid))
		return
	}
	var req machine.MemoryRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		writeError(w, fmt.Errorf("peer %q: memory request: %v: %w", from, err, machine.ErrInvalid))
		return
	}
	// The first bytes decide the status: an error found before any is
	// sent is answered as one.
	bw := &firstWrite{w: w, length: req.Bytes()}
	if err := mem.Send(r.Context(), req, bw); err != nil {
		if !bw.started {
			writeError(w, err)
			return
		}
		panic(http.ErrAbortHandler) // the peer sees the stream cut, and reads the volume
	}
	if !bw.started {
		w.WriteHeader(http.StatusOK)
	}
}

// firstWrite sends a 200 header with its first write.
type firstWrite struct {
	w       http.ResponseWriter
	length  int64
	started bool
}

func (f *firstWrite) Write(b []byte) (int, error) {
	if !f.started {
		f.w.Header().Set("Content-Type", "application/octet-stream")
		f.w.Header().Set("Content-Length", strconv.FormatInt(f.length, 10))
		f.w.WriteHeader(http.StatusOK)
		f.started = true
	}
	return f.w.Write(b)
}

// fetchMemory asks host for extents of its local copy of memory
// (machine.Config.FetchMemory): a host that is not alive by its
// heartbeat is not asked, and one that does not answer within
// peerMemoryAnswer is given up on.
func (p *peers) fetchMemory(ctx context.Context, host string, req machine.MemoryRequest) (io.ReadCloser, error) {
	addr, err := p.alive(ctx, host)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequest(http.MethodPost, "https://"+addr+peerMemoryPath, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Host = host
	ctx, cancel := context.WithCancel(ctx)
	late := time.AfterFunc(peerMemoryAnswer, cancel)
	resp, err := (&http.Client{Transport: p.transport(host, addr)}).Do(hr.WithContext(ctx))
	if !late.Stop() && err == nil {
		resp.Body.Close()
		err = fmt.Errorf("no answer within %s", peerMemoryAnswer)
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("memory from host %q: %w", host, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		defer cancel()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("memory from host %q: %s: %s", host, resp.Status, bytes.TrimSpace(msg))
	}
	return cancelOnClose{resp.Body, cancel}, nil
}

// cancelOnClose is a response body whose close also ends its request's
// context.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
