package daemon

import (
	"net/http"

	"github.com/denhq/den/api"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/machine"
)

// getNet answers a VM's network: mode, address, policy, what it refused.
func (s *Server) getNet(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	s.writeNet(w, r, name)
}

func (s *Server) writeNet(w http.ResponseWriter, r *http.Request, name string) {
	st, err := s.m.NetStatus(r.Context(), name)
	if err != nil {
		writeError(w, err)
		return
	}
	out := api.NetInfo{Name: name, Mode: st.Mode, IP: st.IP, Egress: st.Policy}
	if h := st.Host; h != nil {
		out.Tap, out.DeniedPackets = h.Tap, h.DeniedPackets
		out.DNSQueries, out.DNSRefused, out.RefusedNames = h.DNSQueries, h.DNSRefused, h.RefusedNames
		for _, d := range h.Denied {
			out.Denied = append(out.Denied, api.Denied{Addr: d.Addr, Proto: d.Proto, Port: d.Port, Packets: d.Packets})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// setEgress changes a VM's egress policy, live.
func (s *Server) setEgress(w http.ResponseWriter, r *http.Request) {
	var req api.EgressRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	p, err := egress.Parse(req.Policy)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := opContext(r)
	defer cancel()
	if err := s.m.SetEgress(ctx, name, p); err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("den: egress policy", "vm", name, "policy", p.String())
	s.writeNet(w, r, name)
}

// getURL answers a VM's URL (making its token the first time).
func (s *Server) getURL(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !s.owned(w, r, name) {
		return
	}
	u, err := s.m.URL(r.Context(), name)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.urlInfo(name, u))
}

// setURL changes a VM's URL settings.
func (s *Server) setURL(w http.ResponseWriter, r *http.Request) {
	var req api.URLRequest
	name, ok := s.ownedRequest(w, r, &req)
	if !ok {
		return
	}
	u, err := s.m.SetURL(r.Context(), name, machine.URLChange{Port: req.Port, Public: req.Public, Rotate: req.Rotate})
	if err != nil {
		writeError(w, err)
		return
	}
	// What the old token opened, or the URL while public, closes with it.
	if req.Rotate || (req.Public != nil && !*req.Public) {
		if n := s.web.cut(name); n > 0 {
			s.log.Info("den: url connections closed", "vm", name, "connections", n, "rotate", req.Rotate)
		}
	}
	writeJSON(w, http.StatusOK, s.urlInfo(name, u))
}

func (s *Server) urlInfo(name string, u machine.URLSettings) api.URLInfo {
	out := api.URLInfo{Name: name, URL: s.web.vmURL(name, u), Port: u.Port, Public: u.Public}
	if !u.Public {
		out.Token = u.Token
	}
	return out
}
