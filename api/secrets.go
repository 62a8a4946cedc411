package api

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Secret is one of den's secrets, never its value (GET /v1/secrets).
type Secret struct {
	Name  string `json:"name"`
	Owner string `json:"owner"`
	// Kind is ssh: a private key VMs granted it sign with through their
	// SSH agent socket, for its hosts only; or https: a token den puts
	// in the Header (or Query parameter) of VMs' HTTPS requests to its
	// hosts, in place of the placeholder den-secret:NAME that the VMs
	// hold in the environment variable Env.
	Kind      string    `json:"kind"`
	Hosts     []string  `json:"hosts"`
	HostKeys  []string  `json:"host_keys,omitempty"`
	PublicKey string    `json:"public_key,omitempty"`
	Header    string    `json:"header,omitempty"`
	Query     string    `json:"query,omitempty"`
	Env       string    `json:"env,omitempty"`
	Created   time.Time `json:"created"`
	Updated   time.Time `json:"updated"`
}

// AddSecretRequest stores a new secret (POST /v1/secrets).
type AddSecretRequest struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Value is the secret: an SSH private key without a passphrase, or
	// an HTTPS token (one line).
	Value string `json:"value"`
	// KnownHosts are known_hosts lines of the destinations (ssh).
	KnownHosts string `json:"known_hosts,omitempty"`
	// Hosts are the destinations, and Header or Query where the value
	// goes, Env the VMs' variable holding the placeholder (https).
	Hosts  []string `json:"hosts,omitempty"`
	Header string   `json:"header,omitempty"`
	Query  string   `json:"query,omitempty"`
	Env    string   `json:"env,omitempty"`
}

// SetSecretRequest replaces a secret's value (PUT /v1/secrets/{secret}).
type SetSecretRequest struct {
	Value string `json:"value"`
}

// GrantRequest lets a VM use a secret (POST /v1/vms/{name}/secrets).
type GrantRequest struct {
	Secret string `json:"secret"`
}

func secretPath(name string) string { return "/v1/secrets/" + url.PathEscape(name) }

// Secrets lists the caller's secrets.
func (c *Client) Secrets(ctx context.Context) ([]Secret, error) {
	var out []Secret
	return out, c.do(ctx, http.MethodGet, "/v1/secrets", nil, &out)
}

// AddSecret stores a new secret.
func (c *Client) AddSecret(ctx context.Context, req AddSecretRequest) (Secret, error) {
	var out Secret
	return out, c.do(ctx, http.MethodPost, "/v1/secrets", req, &out)
}

// SetSecret replaces a secret's value, for every VM granted it at once.
func (c *Client) SetSecret(ctx context.Context, name, value string) (Secret, error) {
	var out Secret
	return out, c.do(ctx, http.MethodPut, secretPath(name), SetSecretRequest{Value: value}, &out)
}

// RemoveSecret deletes a secret and its grants.
func (c *Client) RemoveSecret(ctx context.Context, name string) (Secret, error) {
	var out Secret
	return out, c.do(ctx, http.MethodDelete, secretPath(name), nil, &out)
}

// VMSecrets lists the secrets granted to a VM.
func (c *Client) VMSecrets(ctx context.Context, vm string) ([]string, error) {
	var out []string
	return out, c.do(ctx, http.MethodGet, vmPath(vm, "secrets"), nil, &out)
}

// GrantSecret lets a VM use a secret, from its next request on; the
// answer is the VM's grants.
func (c *Client) GrantSecret(ctx context.Context, vm, secret string) ([]string, error) {
	var out []string
	return out, c.do(ctx, http.MethodPost, vmPath(vm, "secrets"), GrantRequest{Secret: secret}, &out)
}

// RevokeSecret takes a grant back at once; the answer is the VM's grants.
func (c *Client) RevokeSecret(ctx context.Context, vm, secret string) ([]string, error) {
	var out []string
	return out, c.do(ctx, http.MethodDelete, vmPath(vm, "secrets", secret), nil, &out)
}
