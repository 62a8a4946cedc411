package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/internal/validate"
)

// A sandbox's ports other than envd's are served at PORT-ID.DOMAIN (the
// host sandbox.getHost(port) gives) or with the E2b-Sandbox-Port
// header: each request is proxied over den's agent channel to
// 127.0.0.1:PORT in the guest, waking the VM as any den URL does. As on
// E2B they are public unless the sandbox was made with
// allowPublicTraffic false; then a request carries the sandbox's
// trafficAccessToken in E2b-Traffic-Access-Token.

// trafficHeader carries a private sandbox's traffic access token.
const trafficHeader = "E2b-Traffic-Access-Token"

// portDialTimeout bounds reaching the guest (a wake included).
const portDialTimeout = 2 * time.Minute

func (s *Server) servePort(w http.ResponseWriter, r *http.Request, id string, port int) {
	notFound := func() {
		writeError(w, http.StatusNotFound, fmt.Sprintf("den: sandbox %q not found (a VM made with den create is reached with den url)", id))
	}
	rec, ok := s.recs.get(id)
	if validate.VMName(id) != nil || !ok || rec.Making || rec.Killed || !rec.Made {
		notFound()
		return
	}
	if port <= 0 || port > 65535 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("den: bad sandbox port %q", r.Header.Get("E2b-Sandbox-Port")))
		return
	}
	if rec.TrafficToken != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(trafficHeader)), []byte(rec.TrafficToken)) != 1 {
		writeError(w, http.StatusForbidden, fmt.Sprintf("den: sandbox %s takes no public traffic: send its trafficAccessToken in %s", id, trafficHeader))
		return
	}
	cl := s.cfg.As(rec.Owner)
	defer cl.CloseIdle()
	vm, err := cl.GetVM(r.Context(), id)
	if errors.Is(err, api.ErrNotFound) || err == nil && (vm.Owner != rec.Owner || !sameVM(vm, rec)) {
		notFound()
		return
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if err := s.reach(vm); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	// The wake is not cut short by a client that leaves: it finishes,
	// as every den operation does.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), portDialTimeout)
	defer cancel()
	sc, err := cl.SSH(ctx, id)
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Sprintf("den: reaching sandbox %s: %v", id, err))
		return
	}
	defer sc.Close()
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", target
			pr.Out.Host = r.Host
			for _, h := range []string{"E2b-Sandbox-Id", "E2b-Sandbox-Port", trafficHeader} {
				pr.Out.Header.Del(h)
			}
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return sc.DialContext(ctx, "tcp", target)
			},
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: 10 * time.Minute,
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			msg := err.Error()
			if strings.Contains(msg, "refused") {
				msg = "nothing listens there"
			}
			writeError(w, http.StatusBadGateway, fmt.Sprintf("den: port %d of sandbox %s: %s", port, id, msg))
		},
	}
	rp.ServeHTTP(w, r)
}
