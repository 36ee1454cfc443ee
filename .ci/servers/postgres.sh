#!/usr/bin/env bash
# Make sure a PostgreSQL server answers for the tests, and print its URL.
#
#   .ci/servers/postgres.sh <statedir>
#
# Uses the machine's service on 127.0.0.1:5432 when it answers with trust auth for user
# postgres (the case on the development machines). Otherwise starts a throwaway cluster
# (initdb, fsync off) on a free loopback port, installing the Debian package first when no
# PostgreSQL binaries are found (apt-get, needs root). PostgreSQL refuses to run as root, so
# as root its tools run as the postgres user.
#
# stdout: KEY=VALUE lines only (WORLD_TEST_POSTGRES_URL=...); logs go to stderr.
# A started cluster keeps its data and socket in <statedir>/postgres/ and writes
# <statedir>/postgres.pid (the postmaster) and <statedir>/postgres.log. Stop it with
# kill "$(cat <statedir>/postgres.pid)" (smart shutdown) or kill -INT (fast).
set -euo pipefail

log() { echo "postgres.sh: $*" >&2; }

statedir=${1:?usage: postgres.sh <statedir>}
mkdir -p "$statedir"
statedir=$(cd "$statedir" && pwd)

answers() {  # host port: does a trust-auth postgres answer there within a few seconds?
    command -v psql >/dev/null 2>&1 || return 1
    PGCONNECT_TIMEOUT=3 psql -w -X -q -h "$1" -p "$2" -U postgres -d postgres -tAc 'SELECT 1' \
        >/dev/null 2>&1
}

service_port=${WORLD_PG_SERVICE_PORT:-5432}  # another value (e.g. 1) forces a cluster of its own
if answers 127.0.0.1 "$service_port"; then
    log "using the PostgreSQL service on 127.0.0.1:$service_port"
    echo "WORLD_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$service_port/postgres"
    exit 0
fi

find_bin() {
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
        if [[ -x $dir/initdb && -x $dir/pg_ctl ]]; then echo "$dir"; return 0; fi
    done
    if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
    return 1
}

if ! bindir=$(find_bin); then
    if [[ $(id -u) -ne 0 ]]; then
        log "no PostgreSQL binaries and not root: apt-get install -y postgresql, then run again"
        exit 1
    fi
    log "installing the postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    # The package may start its own service; this script uses a cluster of its own instead.
    bindir=$(find_bin) || { log "postgresql installed but initdb not found"; exit 1; }
fi

as_pg() {
    if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

port=$(python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
home="$statedir/postgres"
data="$home/data"
mkdir -p "$home"
touch "$statedir/postgres.log"
if [[ $(id -u) -eq 0 ]]; then
    chown postgres: "$home" "$statedir/postgres.log"
    chmod a+x "$statedir"  # the postgres user must reach its folder (mktemp -d makes 0700)
fi
if [[ ! -f $data/PG_VERSION ]]; then
    log "initdb $data"
    as_pg "$bindir/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-sync >&2
fi
log "starting $bindir/postgres on 127.0.0.1:$port"
as_pg "$bindir/pg_ctl" -D "$data" -l "$statedir/postgres.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $port -k $home -c fsync=off -c max_connections=200" start >&2
head -1 "$data/postmaster.pid" >"$statedir/postgres.pid"
log "postmaster pid $(cat "$statedir/postgres.pid") (log: $statedir/postgres.log)"

for _ in $(seq 1 120); do
    if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then
        echo "WORLD_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$port/postgres"
        exit 0
    fi
    sleep 0.5
done
log "PostgreSQL did not become ready within 60 s; see $statedir/postgres.log"
exit 1
