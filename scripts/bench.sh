#!/usr/bin/env bash
# make bench: den's headline figures (den bench), then the storage
# figures, with each operation's steps (--breakdown). BENCH_ARGS passes
# more options to den bench (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
	echo "bench: den needs root (FUSE, VMs): run make bench as root" >&2
	exit 1
fi
export DEN_JUICEFS="$PWD/bin/juicefs"
# shellcheck disable=SC2086
bin/den bench --breakdown ${BENCH_ARGS:-}
if [ -x scripts/bench-storage.sh ]; then
	scripts/bench-storage.sh
fi
