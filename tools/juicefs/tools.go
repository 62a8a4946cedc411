//go:build tools

// Package tools records the JuiceFS command as a dependency of this module so
// that `go mod tidy` keeps it and `go build github.com/juicedata/juicefs`
// builds the pinned version.
package tools

import _ "github.com/juicedata/juicefs"
