#!/usr/bin/env bash
# Storage benchmark: through a real FUSE mount of each volume shape
# (embedded; MinIO data with sqlite metadata; the same with --writeback;
# MinIO + PostgreSQL, the shared shape), clone time against file size
# (1, 4, 16 GiB sparse, 64 MiB of data each), sequential and 4 KiB random
# I/O. Prints a table of medians of DEN_BENCH_RUNS runs (default 5).
# Needs root, FUSE, bin/juicefs and bin/minio (make deps), PostgreSQL.
#   DEN_BENCH_SHAPES="embedded minio"   only some shapes
#   DEN_BENCH_OUT=file.md               also write the table there
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
"$root/scripts/deps-tools.sh"
echo "bench: storage (${DEN_BENCH_SHAPES:-all shapes}, ${DEN_BENCH_RUNS:-5} runs each)"
DEN_BENCH=1 go test -count=1 -timeout 60m -run '^TestBenchStorage$' -v ./storage/ 2>&1 |
	grep -v -e ' INFO storage: ' -e '^=== RUN'
