// Package netlimit bounds what clients can take of den's listeners:
// connections per source address and in all, HTTP header sizes and
// timeouts, and log lines about what fails before authentication.
package netlimit
