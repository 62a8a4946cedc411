#!/usr/bin/env bash
# make bench: den's headline figures (den bench), with each operation's
# steps (--breakdown), then the official e2b SDK against den's own path
# (den bench --e2b), then the storage figures, then the cluster's.
# BENCH_ARGS passes more options to den bench (e.g. --quick),
# BENCH_E2B_ARGS to den bench --e2b (e.g. --runs 5), BENCH_CLUSTER_RUNS
# sets the cluster's runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
	echo "bench: den needs root (FUSE, VMs): run make bench as root" >&2
	exit 1
fi
export DEN_JUICEFS="$PWD/bin/juicefs"
# shellcheck disable=SC2086
bin/den bench --breakdown ${BENCH_ARGS:-}
# shellcheck disable=SC2086
bin/den bench --e2b ${BENCH_E2B_ARGS:-}
if [ -x scripts/bench-storage.sh ]; then
	scripts/bench-storage.sh
fi
scripts/bench-cluster.sh
