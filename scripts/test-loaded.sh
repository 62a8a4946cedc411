#!/usr/bin/env bash
# test-loaded.sh [RUNS [GO TEST FLAGS...]]: the end-to-end suite RUNS times
# in a row (default 3) with every CPU kept busy by a background job, as on
# a loaded host; e.g. scripts/test-loaded.sh 3 -v.
# The tests wait on conditions with deadlines, never on sleeps chosen to be
# long enough, so they must pass here as they do on an idle machine.
# Run `make test` (or `make deps build image`) once first.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
n=$(nproc)
pids=()
for _ in $(seq "$n"); do
	(while :; do :; done) &
	pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
echo "test-loaded: $n busy loops in the background"
for i in $(seq "$runs"); do
	start=$SECONDS
	echo "test-loaded: run $i of $runs"
	go test -count=1 -timeout 60m "$@" ./e2e/
	echo "test-loaded: run $i passed in $((SECONDS - start)) s"
done
echo "test-loaded: $runs runs passed under load"
