#!/usr/bin/env bash
# Make sure a Redis test server answers on loopback, and say where.
#
#   .ci/servers/redis.sh <statedir>
#
# Installs redis-server/redis-cli (apt-get, after apt-get update) if either is missing. Uses the
# server on 127.0.0.1:6379 when it answers PING; otherwise starts a throwaway one (no
# persistence) on a free port in <statedir> and writes <statedir>/redis.pid.
# Stop what this started: kill "$(cat <statedir>/redis.pid)".
#
# The world_redis tests start their own Redis Cluster and durable (appendfsync always)
# servers from the same binaries; only the single-node URL is printed here.
#
# stdout: KEY=VALUE lines only (WORLD_TEST_REDIS_URL=...); logs go to stderr.
set -euo pipefail

log() { echo "redis.sh: $*" >&2; }

statedir=${1:?usage: redis.sh <statedir>}
mkdir -p "$statedir"
statedir=$(cd "$statedir" && pwd)

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    log "installing redis-server (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y redis-server >&2
fi

answers() { [[ $(redis-cli -h 127.0.0.1 -p "$1" PING 2>/dev/null) == PONG ]]; }

known=${REDIS_KNOWN_PORT:-6379}  # the machine's usual server; override to test the start path
if answers "$known"; then
    log "using the server already answering on 127.0.0.1:$known"
    echo "WORLD_TEST_REDIS_URL=redis://127.0.0.1:$known/0"
    exit 0
fi

port=$(python3 - <<'EOF'
import socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
EOF
)

redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --daemonize yes \
    --dir "$statedir" --pidfile "$statedir/redis.pid" --logfile "$statedir/redis.log" >&2

for _ in $(seq 1 100); do
    if answers "$port"; then
        log "redis-server pid $(cat "$statedir/redis.pid") on 127.0.0.1:$port (log: $statedir/redis.log)"
        echo "WORLD_TEST_REDIS_URL=redis://127.0.0.1:$port/0"
        exit 0
    fi
    sleep 0.1
done
log "redis-server on port $port did not answer within 10 s; see $statedir/redis.log"
exit 1
