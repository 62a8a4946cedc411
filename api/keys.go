package api

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Key is a user's SSH public key, which logs the user in to the SSH
// gateway.
type Key struct {
	Fingerprint string    `json:"fingerprint"` // SHA256:...
	User        string    `json:"user"`
	Name        string    `json:"name"`
	PublicKey   string    `json:"public_key"` // authorized_keys form
	CreatedAt   time.Time `json:"created_at"`
}

// AddKeyRequest registers a public key. User is an admin's to choose;
// any other caller's keys are their own whatever the body says.
type AddKeyRequest struct {
	// User the key logs in as (default "default").
	User string `json:"user,omitempty"`
	// Name labels the key (default: its comment).
	Name string `json:"name,omitempty"`
	// PublicKey in authorized_keys / .pub form.
	PublicKey string `json:"public_key"`
}

// AddKey registers a public key (POST /v1/keys).
func (c *Client) AddKey(ctx context.Context, req AddKeyRequest) (Key, error) {
	var k Key
	err := c.do(ctx, http.MethodPost, "/v1/keys", req, &k)
	return k, err
}

// ListKeys lists the registered keys (GET /v1/keys): every user's for an
// admin, the caller's own for anyone else.
func (c *Client) ListKeys(ctx context.Context) ([]Key, error) {
	var keys []Key
	err := c.do(ctx, http.MethodGet, "/v1/keys", nil, &keys)
	return keys, err
}

// RemoveKey unregisters the key whose fingerprint or name is ref and
// returns it (DELETE /v1/keys?ref=REF).
func (c *Client) RemoveKey(ctx context.Context, ref string) (Key, error) {
	var k Key
	err := c.do(ctx, http.MethodDelete, "/v1/keys?ref="+url.QueryEscape(ref), nil, &k)
	return k, err
}
