//go:build tools

// Package tools records the MinIO server as a dependency of this module so
// that `go mod tidy` keeps it and `go build github.com/minio/minio` builds
// the pinned version.
package tools

import _ "github.com/minio/minio"
