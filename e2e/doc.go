// Package e2e drives den end to end as a user does: the den binary, a
// daemon with a temporary state dir and an embedded JuiceFS volume, and
// real QEMU guests booted from the images `make image` built. The tests
// need root and the built images; `go test -short` skips them.
package e2e
