package api

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Token is an API token: it authenticates requests on the daemon's TLS
// listener as its user. The secret is shown once, when it is made; the
// daemon keeps only its hash.
type Token struct {
	ID        string    `json:"id"` // tok_...
	User      string    `json:"user"`
	Name      string    `json:"name"`
	Admin     bool      `json:"admin,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	LastUsed  time.Time `json:"last_used,omitzero"`
	// Secret is set only in the answer to POST /v1/tokens.
	Secret string `json:"secret,omitempty"`
}

// AddTokenRequest makes a token. User (default: the caller) and Admin
// are an admin's to choose.
type AddTokenRequest struct {
	Name  string `json:"name"`
	User  string `json:"user,omitempty"`
	Admin bool   `json:"admin,omitempty"`
}

// AddToken makes a token (POST /v1/tokens); its secret is in the answer
// and nowhere else.
func (c *Client) AddToken(ctx context.Context, req AddTokenRequest) (Token, error) {
	var t Token
	err := c.do(ctx, http.MethodPost, "/v1/tokens", req, &t)
	return t, err
}

// ListTokens lists tokens (GET /v1/tokens): every user's for an admin,
// the caller's own for anyone else. No secrets.
func (c *Client) ListTokens(ctx context.Context) ([]Token, error) {
	var ts []Token
	err := c.do(ctx, http.MethodGet, "/v1/tokens", nil, &ts)
	return ts, err
}

// RemoveToken revokes the token whose id or name is ref (DELETE
// /v1/tokens?ref=REF) and returns it.
func (c *Client) RemoveToken(ctx context.Context, ref string) (Token, error) {
	var t Token
	err := c.do(ctx, http.MethodDelete, "/v1/tokens?ref="+url.QueryEscape(ref), nil, &t)
	return t, err
}
