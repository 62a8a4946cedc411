#!/usr/bin/env bash
# Builds the pinned tool binaries den runs as separate programs:
#   bin/juicefs  from tools/juicefs (github.com/juicedata/juicefs, cgo),
#                with tools/juicefs/patch added (see juicefs_patched); its
#                version says so (juicefs --version: 1.4.1+den.pgretry)
#   bin/minio    from tools/minio   (github.com/minio/minio, AGPL: tests and
#                local S3 only, never linked into den)
# Each is rebuilt only when missing or when its pin changed: a stamp file
# beside the binary records a hash of the tool module's go.mod and go.sum,
# of its patch if any, and of the Go version. Idempotent; one line per step.
set -euo pipefail
shopt -s inherit_errexit # a step that fails in $(...) fails the script
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
	local patch=()
	if [ -d "$root/tools/$1/patch" ]; then
		patch=("$root/tools/$1"/patch/* "$root/scripts/deps-tools.sh") # the patch, and the awk that hooks it
	fi
	cat "$root/tools/$1/go.mod" "$root/tools/$1/go.sum" "${patch[@]}" <("$go" env GOVERSION GOOS GOARCH) |
		sha256sum | cut -d' ' -f1
}

# juicefs_patched: a copy of the pinned JuiceFS module in bin/juicefs.build,
# with tools/juicefs/patch/pgretry.go.in added to its pkg/meta and its
# (*dbMeta).shouldRetry calling it first for PostgreSQL, so that JuiceFS
# runs a metadata transaction again when PostgreSQL restarts rather than
# failing a VM's disk for good (the file's comment says why). Prints the
# go build flags that build tools/juicefs against the copy, and mark its
# version. A JuiceFS whose shouldRetry has changed fails here, before
# anything is built.
juicefs_patched() {
	local dir out="$bin/juicefs.build"
	dir="$(cd "$root/tools/juicefs" && "$go" mod download -json github.com/juicedata/juicefs |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	if [ ! -f "$dir/pkg/meta/sql.go" ]; then
		echo "deps: juicefs: no pkg/meta/sql.go in the module ($dir)" >&2
		return 1
	fi
	rm -rf "$out"
	mkdir -p "$out"
	cp -r "$dir" "$out/src"
	chmod -R u+w "$out/src"
	awk '
		/^func \(m \*dbMeta\) shouldRetry\(err error\) bool \{$/ { in_fn = 1 }
		/^}$/ { in_fn = 0 }
		{ print }
		in_fn && /^\tcase "postgres":$/ {
			print "\t\tif denRetryable(err) {"
			print "\t\t\treturn true"
			print "\t\t}"
			in_fn = 0
			hooked++
		}
		END { if (hooked != 1) exit 1 }
	' "$dir/pkg/meta/sql.go" >"$out/src/pkg/meta/sql.go" || {
		echo "deps: juicefs: its (*dbMeta).shouldRetry has no PostgreSQL case to hook: see tools/juicefs/patch" >&2
		return 1
	}
	cp "$root/tools/juicefs/patch/pgretry.go.in" "$out/src/pkg/meta/den_pgretry.go"
	cp "$root/tools/juicefs/go.sum" "$out/go.sum"
	{
		cat "$root/tools/juicefs/go.mod"
		echo "replace github.com/juicedata/juicefs => $out/src"
	} >"$out/go.mod"
	echo "-modfile=$out/go.mod"
	# storage.Open warns when a cluster's juicefs lacks this mark.
	echo "-ldflags=-X github.com/juicedata/juicefs/pkg/version.revisionDate=den -X github.com/juicedata/juicefs/pkg/version.revision=pgretry"
}

# build NAME MODULE CGO ESTIMATE [PREPARE]: PREPARE, run only when the
# binary is built, prints go build's flags for it, one a line (and may
# keep what it makes in bin/NAME.build, removed after).
build() {
	local name="$1" module="$2" cgo="$3" estimate="$4" prepare="${5:-}"
	local flags=()
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
	if [ -n "$prepare" ]; then
		local printed
		printed="$("$prepare")"
		mapfile -t flags <<<"$printed"
	fi
	(cd "$root/tools/$name" && CGO_ENABLED="$cgo" "$go" build "${flags[@]}" -o "$out.tmp" "$module")
	mv -f "$out.tmp" "$out"
	rm -rf "$bin/$name.build" # what PREPARE made
	echo "$want" >"$out.stamp"
	echo "deps: built $name $ver in $((SECONDS - start))s"
}

if [ "${1:-}" != "minio" ]; then
	if ! command -v gcc >/dev/null; then
		echo "deps: juicefs needs cgo: install gcc (apt-get install gcc)" >&2
		exit 1
	fi
	build juicefs github.com/juicedata/juicefs 1 "~6 min" juicefs_patched
fi
if [ "${1:-}" != "juicefs" ]; then
	build minio github.com/minio/minio 0 "~4 min"
fi
if ! command -v fusermount3 >/dev/null; then
	echo "deps: warning: fusermount3 missing: the volume needs fuse3 (scripts/deps-apt.sh installs it)" >&2
fi
