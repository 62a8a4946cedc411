#!/usr/bin/env bash
# A den cluster on this machine, end to end: a real PostgreSQL (den's
# registry and the volume's metadata) and a real MinIO (the volume's
# data), three hosts (den daemons with state dirs of their own) sharing
# them, their peer listeners on loopback over mutual TLS. A VM made on one
# host is used through another, moved to a third, and when its host is
# killed (kill -9 of its daemon, fence guard and VMMs, as a power cut)
# the other hosts take its VMs over: one boots at once (--on-host-loss
# restart), the other boots from its disk when next used.
# Prints what each step took. Run by `make demo-cluster` after deps,
# build, image. DEN_DEMO_KEEP=1 keeps its directory (logs) on success.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	echo "demo-cluster: den needs root (FUSE, VMs): run make demo-cluster as root" >&2
	exit 1
fi
IMAGE=${DEN_DEMO_IMAGE:-minimal}
den=$PWD/bin/den
work=$(mktemp -d /tmp/den-cluster-XXXXXX)
chmod 0711 "$work" # VMMs run as den-vm, which must pass through to their run dirs
hosts=(host-a host-b host-c)
pg_pw=den-demo-pg
minio_user=den-demo
minio_pw=den-demo-secret

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$pgbin" ] || [ ! -x "$pgbin/initdb" ]; then
	echo "demo-cluster: PostgreSQL not found (make deps installs it)" >&2
	exit 1
fi

# port: a free loopback port.
port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 30000))
		if ! (: >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}
pg_port=$(port)
minio_port=$(port)

# on HOST den ARGS...: den through HOST's socket.
on() {
	local h=$1
	shift
	DEN_SOCKET=$work/$h/den.sock "$den" "$@"
}

cleanup() {
	status=$?
	set +e
	for h in "${hosts[@]}"; do
		if [ -S "$work/$h/den.sock" ] && kill -0 "$(cat "$work/$h/daemon.pid" 2>/dev/null)" 2>/dev/null; then
			for vm in $(on "$h" ls --json 2>/dev/null | sed -n 's/^    "name": "\(.*\)",$/\1/p'); do
				on "$h" rm --force "$vm" >/dev/null 2>&1
			done
			break
		fi
	done
	for h in "${hosts[@]}"; do
		pid=$(cat "$work/$h/daemon.pid" 2>/dev/null) && kill -TERM "$pid" 2>/dev/null
	done
	for h in "${hosts[@]}"; do
		pid=$(cat "$work/$h/daemon.pid" 2>/dev/null) || continue
		for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	done
	# What a killed host left: its fence guard, its VMMs, its mounts.
	pkill -9 -f -- "--state-dir $work/" 2>/dev/null
	pkill -9 -f -- "$work/.*/run/" 2>/dev/null
	for m in $(grep -o " $work/[^ ]*" /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null; done
	[ -d "$work/pg/data" ] && runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/pg/data" stop -m fast >/dev/null 2>&1
	# (Steps run in subshells: the servers' pids are in files.)
	for f in minio.pid pg.pid; do
		pid=$(cat "$work/$f" 2>/dev/null) || continue
		kill "$pid" 2>/dev/null
		for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	done
	if [ $status -eq 0 ] && [ -z "${DEN_DEMO_KEEP:-}" ]; then
		rm -rf "$work"
	else
		echo "demo-cluster: failed; logs in $work (*/daemon.log, pg.log, minio.log)" >&2
		for h in "${hosts[@]}"; do
			[ -f "$work/$h/daemon.log" ] && { echo "--- $h" >&2; tail -n 8 "$work/$h/daemon.log" >&2; }
		done
	fi
	exit $status
}
trap cleanup EXIT

# step TITLE CMD...: run a step, show its output indented, and its time.
step() {
	local title=$1
	shift
	printf '\n\033[1m== %s\033[0m\n   $ %s\n' "$title" "$*"
	local start end
	start=$(date +%s%N)
	"$@" 2>&1 | sed 's/^/   /'
	end=$(date +%s%N)
	printf '   (%d ms)\n' $(((end - start) / 1000000))
	timings+=("$(printf '%-56s %6d ms' "$title" $(((end - start) / 1000000)))")
}
timings=()

start_postgres() {
	mkdir -p "$work/pg"
	echo "$pg_pw" >"$work/pg/pw"
	chown -R postgres: "$work/pg"
	runuser -u postgres -- "$pgbin/initdb" -D "$work/pg/data" -U postgres --auth=scram-sha-256 --pwfile="$work/pg/pw" --no-sync >"$work/pg.log" 2>&1
	runuser -u postgres -- "$pgbin/postgres" -D "$work/pg/data" -k "$work/pg" -p "$pg_port" -h 127.0.0.1 >>"$work/pg.log" 2>&1 &
	echo $! >"$work/pg.pid"
	for _ in $(seq 1 300); do
		"$pgbin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" && break
		sleep 0.1
	done
	for db in den den_volume; do
		PGPASSWORD=$pg_pw "$pgbin/psql" -q -h 127.0.0.1 -p "$pg_port" -U postgres -c "CREATE DATABASE $db"
	done
	echo "PostgreSQL on 127.0.0.1:$pg_port: databases den (registry) and den_volume (the volume's metadata)"
}

start_minio() {
	mkdir -p "$work/minio"
	MINIO_ROOT_USER=$minio_user MINIO_ROOT_PASSWORD=$minio_pw bin/minio server --quiet --address "127.0.0.1:$minio_port" \
		"$work/minio" >"$work/minio.log" 2>&1 &
	echo $! >"$work/minio.pid"
	for _ in $(seq 1 300); do
		(: >"/dev/tcp/127.0.0.1/$minio_port") 2>/dev/null && break
		sleep 0.1
	done
	echo "MinIO on 127.0.0.1:$minio_port (the volume's data)"
}

# configure: the cluster's CA, secrets, and each host's config.
configure() {
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=den-demo-cluster \
		-addext basicConstraints=critical,CA:TRUE -keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null
	(
		umask 077
		printf '{"registry_password": "%s"}\n' "$pg_pw" >"$work/cluster-secrets.json"
		printf '{"access_key": "%s", "secret_key": "%s", "meta_password": "%s"}\n' "$minio_user" "$minio_pw" "$pg_pw" >"$work/volume-secrets.json"
	)
	for h in "${hosts[@]}"; do
		mkdir -p "$work/$h"
		cat >"$work/$h.json" <<EOF
{
  "host": "$h",
  "address": "127.0.0.1:$(port)",
  "ca_cert": "ca.crt",
  "ca_key": "ca.key",
  "registry": "postgres://postgres@127.0.0.1:$pg_port/den?sslmode=disable",
  "secrets_file": "cluster-secrets.json",
  "volume": {
    "meta_url": "postgres://postgres@127.0.0.1:$pg_port/den_volume?sslmode=disable",
    "s3": {"endpoint": "http://127.0.0.1:$minio_port", "bucket": "den-demo", "create_bucket": true},
    "secrets_file": "volume-secrets.json"
  },
  "lease": "6s"
}
EOF
	done
	echo "cluster CA, secrets and the hosts' configs in $work"
	cat "$work/host-a.json"
}

# start_host HOST: its daemon in the background, waiting for its socket.
start_host() {
	local h=$1
	"$den" daemon --state-dir "$work/$h/state" --socket "$work/$h/den.sock" --images "$PWD/build/images" \
		--default-image "$IMAGE" --ssh-listen off --net user --cluster "$work/$h.json" >"$work/$h/daemon.log" 2>&1 &
	echo $! >"$work/$h/daemon.pid"
	for _ in $(seq 1 600); do
		[ -S "$work/$h/den.sock" ] && return 0
		sleep 0.1
	done
	echo "$h did not start"
	return 1
}

# kill_host HOST: a power cut: its daemon, fence guard and VMMs, at once.
kill_host() {
	local h=$1
	pkill -9 -f -- "--state-dir $work/$h/state" || true
	pkill -9 -f -- "$work/$h/state/run/" || true
	echo "killed $h's daemon, fence guard and VMMs"
}

# wait_for HOST VM STATE: until HOST's den info shows VM in STATE.
wait_for() {
	local out
	for _ in $(seq 1 600); do
		# (Read whole: grep -q would close the pipe before den is done.)
		if out=$(on "$1" info "$2" 2>/dev/null) && grep -q "^state: *$3" <<<"$out"; then
			grep -E '^(state|reason):' <<<"$out" | fold -s -w 100
			return 0
		fi
		sleep 0.2
	done
	echo "$2 never reached $3"
	return 1
}

step "start PostgreSQL" start_postgres
step "start MinIO" start_minio
step "the cluster's CA and configs" configure
for h in "${hosts[@]}"; do
	step "start $h (den daemon --cluster $h.json)" start_host "$h"
done
step "the hosts, seen from host-c" on host-c hosts

step "create box on host-a" on host-a create box --memory 256M --idle-timeout 0
step "write a file, start a process" on host-a exec box -- sh -c 'echo made on host-a > /root/note; sync; sleep 100000 </dev/null >/dev/null 2>&1 &'
step "use it through host-c (forwarded over mutual TLS)" on host-c exec box -- cat /root/note
step "where it runs, seen from host-c" sh -c "DEN_SOCKET=$work/host-c/den.sock $den info box | head -n 2"
step "move it to host-b (sleep on host-a, wake on host-b)" on host-c move box --to host-b
step "its file and process came along" on host-a exec box -- sh -c 'cat /root/note; grep -q "10000[0]" /proc/[0-9]*/cmdline 2>/dev/null && echo "the process runs on"'
step "create svc on host-b, restarted elsewhere if host-b is lost" on host-b create svc --memory 256M --idle-timeout 0 --on-host-loss restart
step "host-b dies" kill_host host-b
step "another host takes box over: stopped, lost with host-b" wait_for host-a box stopped
step "and boots svc at once" wait_for host-c svc running
step "box boots from its disk when used" on host-c exec box -- cat /root/note
step "the hosts now" on host-a hosts

printf '\n\033[1m== what each step took (%s)\033[0m\n' "$(on host-a info --json | sed -n 's/.*"accel": "\(.*\)",/\1/p')"
printf '   %s\n' "${timings[@]}"
