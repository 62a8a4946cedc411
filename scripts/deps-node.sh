#!/usr/bin/env bash
# Installs the official e2b npm package that den's E2B e2e test drives, as
# pinned in e2e/e2bsdk/package-lock.json (npm ci), with Debian's nodejs and
# npm when node or npm is missing. Idempotent: a stamp in node_modules
# records the lock file's hash and node's version; npm ci runs only when
# either changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/e2e/e2bsdk"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: node and npm are missing; run as root (or: sudo apt-get install nodejs npm)" >&2
		exit 1
	fi
	echo "deps: apt-get install nodejs npm"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

stamp="$dir/node_modules/.den-stamp"
want="$(cat "$dir/package-lock.json" <(node --version) | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$dir/node_modules/e2b/package.json" ]; then
	echo "deps: e2b SDK present ($(node -p 'require(process.argv[1]).version' "$dir/node_modules/e2b/package.json"))"
	exit 0
fi
echo "deps: npm ci in e2e/e2bsdk"
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
echo "$want" >"$stamp"
echo "deps: e2b SDK $(node -p 'require(process.argv[1]).version' "$dir/node_modules/e2b/package.json")"
