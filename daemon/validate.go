package daemon

import (
	"fmt"

	"github.com/denhq/den/fsdiff"
	"log/slog"
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/netlimit"
	"github.com/denhq/den/internal/validate"
)

// NewHTTPServer serves h (NewServer's) on the API's listeners with
// netlimit.API's limits, learning each connection's caller as ids says
// (nil: root and DefaultAdminGroup administer). The whole request has
// RequestTimeout; once its body is read to its end (decode reads it
// whole), net/http lifts the read deadline itself (it starts its
// background read, which watches for the client going away, without
// one), so a stream, a lock wait or the SSH upgrade that runs for minutes
// is not cut, nor taken for a client that went away
// (TestReadDeadlineLifted); the SSH upgrade sets deadlines of its own on
// the hijacked connection.
func NewHTTPServer(h http.Handler, ids *Identities, log *slog.Logger) *netlimit.HTTP {
	if ids == nil {
		ids = &Identities{AdminGroup: DefaultAdminGroup}
	}
	s := netlimit.NewHTTP("api listener", h, netlimit.API, log)
	s.Server.ConnContext = ids.connContext
	return s
}

// guard runs before every handler: it refuses a bad VM name, checkpoint id or key reference in the header, path or query
// (400, before anything looks them up).
func guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := checkRequest(r); err != nil {
			writeError(w, err)
			return
		}
		h(w, r)
	}
}

// checkRequest checks what names something in a request's header and
// path.
func checkRequest(r *http.Request) error {
	if n := r.PathValue("name"); n != "" {
		if err := validate.VMName(n); err != nil {
			return err
		}
	}
	if id := r.PathValue("id"); id != "" {
		if err := validate.CheckpointID(id); err != nil {
			return err
		}
	}
	if ref := r.URL.Query().Get("ref"); ref != "" {
		if err := validate.KeyRef(ref); err != nil {
			return err
		}
	}
	return nil
}

// checkBody checks the names and free strings of a request body that
// decode read (400 before any work): the same rules as the CLI's, the
// machine's and the registry's.
func checkBody(v any) error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	switch req := v.(type) {
	case *api.CreateRequest:
		add(validate.VMName(req.Name))
		if req.Owner != "" {
			add(validate.User(req.Owner))
		}
		if req.Image != "" {
			add(validate.Image(req.Image))
		}
		add(validate.Duration("idle timeout", req.IdleTimeout))
		if req.OnHostLoss != "" && req.OnHostLoss != "wait" && req.OnHostLoss != "restart" {
			add(fmt.Errorf("on host loss %s: want wait or restart: %w", validate.Quote(req.OnHostLoss), validate.ErrInvalid))
		}
	case *api.CheckpointRequest:
		add(validate.Comment(req.Comment))
	case *api.MoveRequest:
		add(validate.HostName(req.To))
	case *api.RestoreRequest:
		if req.Checkpoint != "" {
			add(validate.CheckpointID(req.Checkpoint))
		}
	case *api.ForkRequest:
		add(validate.VMName(req.Name))
		if req.Checkpoint != "" {
			add(validate.CheckpointID(req.Checkpoint))
		}
	case *api.DiffRequest:
		add(validate.CheckpointID(req.From))
		if req.ToVM != "" {
			add(validate.VMName(req.ToVM))
		}
		if req.To != "" {
			add(validate.CheckpointID(req.To))
		}
		if _, err := fsdiff.CleanPrefix(req.Path); err != nil {
			add(fmt.Errorf("%w: %w", err, validate.ErrInvalid))
		}
	case *api.RestorePathsRequest:
		add(validate.CheckpointID(req.Checkpoint))
		if len(req.Paths) == 0 || len(req.Paths) > api.MaxRestorePaths {
			add(fmt.Errorf("give 1 to %d paths: %w", api.MaxRestorePaths, validate.ErrInvalid))
		}
		for _, p := range req.Paths {
			if c, err := fsdiff.CleanPrefix(p); err != nil {
				add(fmt.Errorf("%w: %w", err, validate.ErrInvalid))
			} else if c == "/" {
				add(fmt.Errorf("path %q is the whole disk: restore the VM itself (den restore): %w", p, validate.ErrInvalid))
			}
		}
	case *api.VerifyRequest:
		if req.Checkpoint != "" {
			add(validate.CheckpointID(req.Checkpoint))
		}
	case *api.AddKeyRequest:
		if req.User != "" {
			add(validate.User(req.User))
		}
		add(validate.KeyName(req.Name))
		add(validate.PublicKey(req.PublicKey))
	case *api.HostSleepRequest:
		add(validate.Duration("timeout", req.Timeout))
	case *api.HostWakeRequest:
		add(validate.Duration("timeout", req.Timeout))
	}
	if len(errs) > 0 {
		return errs[0] // the first: one line for the user
	}
	return nil
}
