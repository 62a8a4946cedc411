package machine

import (
	"context"
	"fmt"

	"github.com/denhq/den/registry"
)

// DefaultURLPort is the guest port a VM's URL reaches unless set.
const DefaultURLPort = 8080

// URLSettings is how a VM's HTTP URL reaches it.
type URLSettings struct {
	// Port is the guest's port the URL proxies to.
	Port int
	// Public: no token needed.
	Public bool
	// Token opens a private URL (32 hex digits).
	Token string
}

// URLChange changes a VM's URL settings; nil fields stay.
type URLChange struct {
	Port   *int
	Public *bool
	// Rotate replaces the token (old URLs stop working).
	Rotate bool
}

// urlOf is a VM's URL settings as recorded (a token is made when missing).
func urlOf(sp spec) URLSettings {
	u := URLSettings{Port: sp.URLPort, Public: sp.URLPublic, Token: sp.URLToken}
	if u.Port == 0 {
		u.Port = DefaultURLPort
	}
	return u
}

// URL returns a VM's URL settings, recording a token the first time.
func (m *Manager) URL(ctx context.Context, name string) (URLSettings, error) {
	u, err := m.URLTarget(ctx, name)
	if err != nil || u.Token != "" {
		return u, err
	}
	return m.SetURL(ctx, name, URLChange{})
}

// URLTarget reads a VM's URL settings without writing anything (the
// ingress asks for every request): a VM without a token yet has a
// private URL nobody can open.
func (m *Manager) URLTarget(ctx context.Context, name string) (URLSettings, error) {
	_, sp, err := m.getSpec(ctx, name)
	if err != nil {
		return URLSettings{}, err
	}
	return urlOf(sp), nil
}

// SetURL changes a VM's URL settings (and makes its token if it has none).
func (m *Manager) SetURL(ctx context.Context, name string, c URLChange) (URLSettings, error) {
	if c.Port != nil && (*c.Port < 1 || *c.Port > 65535) {
		return URLSettings{}, fmt.Errorf("bad port %d: 1 to 65535: %w", *c.Port, ErrInvalid)
	}
	sp, err := m.updateSpec(ctx, name, "url settings", func(sp *spec) error {
		if c.Port != nil {
			sp.URLPort = *c.Port
		}
		if c.Public != nil {
			sp.URLPublic = *c.Public
		}
		if sp.URLToken == "" || c.Rotate {
			sp.URLToken = newToken()
		}
		return nil
	})
	if err != nil {
		return URLSettings{}, fmt.Errorf("url of vm %q: %w", name, err)
	}
	return urlOf(sp), nil
}

// getSpec reads a VM's record and its spec.
func (m *Manager) getSpec(ctx context.Context, name string) (registry.VM, spec, error) {
	vm, err := m.get(ctx, name)
	if err != nil {
		return vm, spec{}, err
	}
	sp, err := decodeSpec(vm)
	return vm, sp, err
}

// updateSpec changes a VM's spec under its lock (kind names the holder)
// with f, and records it: the spec as recorded is returned.
func (m *Manager) updateSpec(ctx context.Context, name, kind string, f func(*spec) error) (_ spec, err error) {
	o, err := m.begin(ctx, name, kind)
	if err != nil {
		return spec{}, err
	}
	defer func() { o.end(err) }()
	// f runs before the write: it may take its time (the egress rules),
	// and the registry is not held meanwhile.
	sp := o.spec
	if err := f(&sp); err != nil {
		return spec{}, err
	}
	if err := o.update(ctx, func(_ *registry.VM, rec *spec) error {
		*rec = sp
		return nil
	}); err != nil {
		return spec{}, err
	}
	return o.spec, nil
}
