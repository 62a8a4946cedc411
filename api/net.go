package api

import (
	"context"
	"net/url"
)

// NetInfo is a VM's network: how it is attached, its address and egress
// policy, and what the policy refused.
type NetInfo struct {
	Name string `json:"name"`
	// Mode is "tap" (a TAP of its own), "user" (the VMM's user-mode
	// network) or "none".
	Mode   string `json:"mode"`
	IP     string `json:"ip,omitempty"`
	Tap    string `json:"tap,omitempty"`
	Egress string `json:"egress"`
	// DeniedPackets counts packets the egress policy dropped; Denied
	// lists their destinations, most refused first.
	DeniedPackets uint64   `json:"denied_packets"`
	Denied        []Denied `json:"denied,omitempty"`
	// DNSQueries and DNSRefused count the VM's resolver's answers;
	// RefusedNames are the last names it refused.
	DNSQueries   uint64   `json:"dns_queries"`
	DNSRefused   uint64   `json:"dns_refused"`
	RefusedNames []string `json:"refused_names,omitempty"`
}

// Denied is one destination a VM's egress policy refused.
type Denied struct {
	Addr    string `json:"addr"`
	Proto   string `json:"proto"`
	Port    int    `json:"port,omitempty"`
	Packets uint64 `json:"packets"`
}

// EgressRequest changes a VM's egress policy.
type EgressRequest struct {
	// Policy is allow-all, deny-all, allow:LIST or deny:LIST[;allow:LIST].
	Policy string `json:"policy"`
}

// URLInfo is a VM's HTTP URL.
type URLInfo struct {
	Name string `json:"name"`
	// URL opens the VM's port through the daemon's HTTP listener (with
	// the token in it for a private URL); "" when the daemon serves no
	// HTTP (--http-listen).
	URL string `json:"url,omitempty"`
	// Port is the guest's port it reaches.
	Port   int  `json:"port"`
	Public bool `json:"public"`
	// Token opens a private URL (Authorization: Bearer TOKEN, or
	// ?den_token=TOKEN).
	Token string `json:"token,omitempty"`
}

// URLRequest changes a VM's URL settings; nil fields stay.
type URLRequest struct {
	Port   *int  `json:"port,omitempty"`
	Public *bool `json:"public,omitempty"`
	// Rotate replaces the token: URLs given out before stop working.
	Rotate bool `json:"rotate,omitempty"`
}

// Net returns a VM's network state.
func (c *Client) Net(ctx context.Context, name string) (NetInfo, error) {
	var n NetInfo
	err := c.do(ctx, "GET", "/v1/vms/"+url.PathEscape(name)+"/net", nil, &n)
	return n, err
}

// SetEgress changes a VM's egress policy, live.
func (c *Client) SetEgress(ctx context.Context, name string, req EgressRequest) (NetInfo, error) {
	var n NetInfo
	err := c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(name)+"/egress", req, &n)
	return n, err
}

// URL returns a VM's HTTP URL.
func (c *Client) URL(ctx context.Context, name string) (URLInfo, error) {
	var u URLInfo
	err := c.do(ctx, "GET", "/v1/vms/"+url.PathEscape(name)+"/url", nil, &u)
	return u, err
}

// SetURL changes a VM's URL settings.
func (c *Client) SetURL(ctx context.Context, name string, req URLRequest) (URLInfo, error) {
	var u URLInfo
	err := c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(name)+"/url", req, &u)
	return u, err
}
