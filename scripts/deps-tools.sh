#!/usr/bin/env bash
# Builds the pinned tool binaries den runs as separate programs:
#   bin/juicefs  from tools/juicefs (github.com/juicedata/juicefs, cgo)
#   bin/minio    from tools/minio   (github.com/minio/minio, AGPL: tests and
#                local S3 only, never linked into den)
# Each is rebuilt only when missing or when its pin changed: a stamp file
# beside the binary records a hash of the tool module's go.mod and go.sum and
# of the Go version. Idempotent; one line per step.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/bin"
go="${GO:-go}"
mkdir -p "$bin"

# version MODDIR MODULE: the version tools/MODDIR/go.mod requires.
version() {
	awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$root/tools/$1/go.mod"
}

# stamp MODDIR: what a binary built from tools/MODDIR depends on.
stamp() {
	cat "$root/tools/$1/go.mod" "$root/tools/$1/go.sum" <("$go" env GOVERSION GOOS GOARCH) | sha256sum | cut -d' ' -f1
}

# build NAME MODULE CGO ESTIMATE
build() {
	local name="$1" module="$2" cgo="$3" estimate="$4"
	local ver want out
	ver="$(version "$name" "$module")"
	ver="${ver#v}"
	want="$(stamp "$name")"
	out="$bin/$name"
	if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$want" ]; then
		echo "deps: $name $ver (cached)"
		return
	fi
	echo "deps: building $name $ver ($estimate)"
	local start=$SECONDS
	(cd "$root/tools/$name" && CGO_ENABLED="$cgo" "$go" build -o "$out.tmp" "$module")
	mv -f "$out.tmp" "$out"
	echo "$want" >"$out.stamp"
	echo "deps: built $name $ver in $((SECONDS - start))s"
}

if [ "${1:-}" != "minio" ]; then
	if ! command -v gcc >/dev/null; then
		echo "deps: juicefs needs cgo: install gcc (apt-get install gcc)" >&2
		exit 1
	fi
	build juicefs github.com/juicedata/juicefs 1 "~6 min"
fi
if [ "${1:-}" != "juicefs" ]; then
	build minio github.com/minio/minio 0 "~4 min"
fi
if ! command -v fusermount3 >/dev/null; then
	echo "deps: warning: fusermount3 missing: the volume needs fuse3 (scripts/deps-apt.sh installs it)" >&2
fi
