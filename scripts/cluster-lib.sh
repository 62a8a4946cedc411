# The setup a den cluster on this machine needs, for scripts/demo-cluster.sh
# and scripts/bench-cluster.sh (sourced, after setting name and hosts): a
# real PostgreSQL (den's registry and the volume's metadata) and a real
# MinIO (the volume's data) on loopback ports, the cluster's CA and
# configs, hosts (den daemons with state dirs of their own, their peer
# listeners on loopback over mutual TLS), and a cleanup that removes all
# of it on exit. Each of the caller's hosts is started or killed by name.

if [ "$(id -u)" -ne 0 ]; then
	echo "$name: den needs root (FUSE, VMs): run make $name as root" >&2
	exit 1
fi
IMAGE=${DEN_DEMO_IMAGE:-minimal}
den=$PWD/bin/den
work=$(mktemp -d "/tmp/den-$name-XXXXXX")
chmod 0711 "$work" # VMMs run as den-vm, which must pass through to their run dirs
pg_pw=den-demo-pg
minio_user=den-demo
minio_pw=den-demo-secret

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$pgbin" ] || [ ! -x "$pgbin/initdb" ]; then
	echo "$name: PostgreSQL not found (make deps installs it)" >&2
	exit 1
fi

# port: a free loopback port.
port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 12000)) # below the ephemeral ports (32768-)
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
		echo "$name: failed; logs in $work (*/daemon.log, pg.log, minio.log)" >&2
		for h in "${hosts[@]}"; do
			[ -f "$work/$h/daemon.log" ] && { echo "--- $h" >&2; tail -n 8 "$work/$h/daemon.log" >&2; }
		done
	fi
	exit $status
}
trap cleanup EXIT

# shellcheck source=scripts/steps.sh
. scripts/steps.sh

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

# configure_host HOST: HOST's config, its peer listener on a port of its
# own.
configure_host() {
	local h=$1
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
		configure_host "$h"
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
