package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path"
	"time"

	"connectrpc.com/connect"
	"github.com/pkg/sftp"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

// maxMessage caps one Connect message (stdin data, a request).
const maxMessage = 16 << 20

func (s *Server) envdRoutes() {
	opts := []connect.HandlerOption{connect.WithCodec(jsonCodec{}), connect.WithReadMaxBytes(maxMessage)}
	processService{s}.routes(opts)
	filesystemService{s}.routes(opts)
	s.envd.HandleFunc("GET /health", s.health)
	s.envd.HandleFunc("GET /files", s.authed(s.download))
	s.envd.HandleFunc("POST /files", s.authed(s.upload))
	s.envd.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("den: %s %s is not an envd call den serves (docs/e2b.md lists them)", r.Method, r.URL.Path))
	})
}

// sandboxID is the sandbox an envd request is for.
func sandboxID(ctx context.Context) string {
	id, _ := ctx.Value(sandboxKey{}).(string)
	return id
}

// envdCaller authenticates a Connect call and checks that its sandbox
// is the caller's; errors are Connect errors.
func (s *Server) envdCaller(ctx context.Context, h http.Header) (*caller, string, error) {
	key := h.Get("X-Access-Token")
	if key == "" {
		key = h.Get("X-API-KEY")
	}
	if key == "" {
		return nil, "", connect.NewError(connect.CodeUnauthenticated, errors.New("den: no access token: the sandbox's envdAccessToken (a den token) goes in X-Access-Token"))
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cl, user, err := s.cfg.Authenticate(actx, key)
	if err != nil {
		return nil, "", connect.NewError(connect.CodeUnauthenticated, errors.New("den: the access token is not a valid den token"))
	}
	c := &caller{api: cl, user: user, key: key}
	id := sandboxID(ctx)
	if err := s.owned(ctx, c, id); err != nil {
		cl.CloseIdle()
		return nil, "", err
	}
	if _, err := userOf(h); err != nil {
		cl.CloseIdle()
		return nil, "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	return c, id, nil
}

// owned checks that sandbox id is the caller's VM.
func (s *Server) owned(ctx context.Context, c *caller, id string) error {
	if validate.VMName(id) != nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("den: sandbox %q not found", id))
	}
	vm, err := c.api.GetVM(ctx, id)
	if errors.Is(err, api.ErrNotFound) || err == nil && (vm.Owner != c.user || s.killed(id)) {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("den: sandbox %q not found", id))
	}
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("den: %w", err))
	}
	if err := s.reach(vm); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}

// guest opens a connection to the sandbox's guest agent through the
// daemon (which wakes the VM if it sleeps).
func guest(ctx context.Context, c *caller, id string) (*agent.Client, error) {
	sc, err := c.api.SSH(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("den: reaching sandbox %s: %w", id, err)
	}
	return agent.FromSSH(sc), nil
}

// health answers 204 when the sandbox runs, 502 when it is paused (as
// envd behind E2B's proxy does), without waking it.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	c, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	defer c.api.CloseIdle()
	id := sandboxID(r.Context())
	vm, ok := s.vm(w, r, c, id)
	if !ok {
		return
	}
	if state(vm) == "paused" {
		writeError(w, http.StatusBadGateway, fmt.Sprintf("den: sandbox %s is paused", id))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sftpOf opens the sandbox's files for an HTTP request, answering
// errors itself.
func (s *Server) sftpOf(w http.ResponseWriter, r *http.Request, c *caller) (*sftp.Client, account, func(), bool) {
	id := sandboxID(r.Context())
	user := r.URL.Query().Get("username")
	if err := checkName(user); err != nil {
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return nil, account{}, nil, false
	}
	vm, ok := s.vm(w, r, c, id)
	if !ok {
		return nil, account{}, nil, false
	}
	if err := s.reach(vm); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return nil, account{}, nil, false
	}
	g, err := guest(r.Context(), c, id)
	if err != nil {
		writeAPIError(w, err)
		return nil, account{}, nil, false
	}
	fs, err := g.SFTP()
	if err != nil {
		g.Close()
		writeError(w, http.StatusBadGateway, "den: sftp: "+err.Error())
		return nil, account{}, nil, false
	}
	acct, err := lookupAccount(fs, user)
	if err != nil {
		fs.Close()
		g.Close()
		writeError(w, http.StatusBadRequest, "den: "+err.Error())
		return nil, account{}, nil, false
	}
	return fs, acct, func() { fs.Close(); g.Close() }, true
}

// fileStatus is the HTTP status of a guest file error.
func fileStatus(err error) int {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, os.ErrPermission):
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

func (s *Server) download(w http.ResponseWriter, r *http.Request, c *caller) {
	q := r.URL.Query().Get("path")
	if q == "" {
		writeError(w, http.StatusBadRequest, "den: path is required")
		return
	}
	fs, acct, done, ok := s.sftpOf(w, r, c)
	if !ok {
		return
	}
	defer done()
	p := acct.abs(q)
	f, err := fs.Open(p)
	if err != nil {
		writeError(w, fileStatus(err), fmt.Sprintf("den: %s: %v", p, err))
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		writeError(w, fileStatus(err), fmt.Sprintf("den: %s: %v", p, err))
		return
	}
	if st.IsDir() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("den: %s is a directory", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Content-Length", fmt.Sprint(st.Size()))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, f); err != nil {
		s.log.Debug("e2b: download", "path", p, "err", err)
	}
}

// writtenEntry is envd's EntryInfo of /files.
type writtenEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request, c *caller) {
	dest := r.URL.Query().Get("path")
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "den: bad gzip body: "+err.Error())
			return
		}
		body = zr
	}
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "multipart/form-data" && dest == "" {
		writeError(w, http.StatusBadRequest, "den: path is required for a raw upload")
		return
	}
	fs, acct, done, ok := s.sftpOf(w, r, c)
	if !ok {
		return
	}
	defer done()
	var out []writtenEntry
	put := func(target string, data io.Reader) bool {
		p := acct.abs(target)
		if err := acct.mkdirAll(fs, path.Dir(p)); err != nil {
			writeError(w, fileStatus(err), fmt.Sprintf("den: %s: %v", path.Dir(p), err))
			return false
		}
		f, err := fs.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			writeError(w, fileStatus(err), fmt.Sprintf("den: %s: %v", p, err))
			return false
		}
		_, err = f.ReadFrom(data)
		if err == nil && (acct.uid != 0 || acct.gid != 0) {
			err = f.Chown(acct.uid, acct.gid) // the file opened, not a symlink's target
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("den: writing %s: %v", p, err))
			return false
		}
		out = append(out, writtenEntry{Path: p, Name: path.Base(p), Type: "file"})
		return true
	}
	if ct != "multipart/form-data" {
		if !put(dest, body) {
			return
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	mr := multipartReader(body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, "den: bad multipart body: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			continue
		}
		target := dest
		if target == "" {
			// The raw file name: multipart's FileName keeps only its base.
			_, cd, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			target = cd["filename"]
		}
		if target == "" {
			writeError(w, http.StatusBadRequest, "den: a file part has no path: give path or a file name")
			return
		}
		if !put(target, part) {
			return
		}
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, "den: no file in the body (a multipart part named file)")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func multipartReader(r io.Reader, boundary string) *multipart.Reader {
	return multipart.NewReader(r, boundary)
}
