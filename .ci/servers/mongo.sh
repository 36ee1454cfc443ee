#!/usr/bin/env bash
# Start a MongoDB wire-protocol test server (mongoeco) on a free loopback port.
#
#   .ci/servers/mongo.sh <statedir>
#
# No mongod can be installed on these machines, so this runs mongoeco's in-memory engine
# behind its wire-protocol proxy; real pymongo clients talk to it. It proves functional
# behaviour only (no change streams, slow as collections grow): never benchmark MongoDB on it.
#
# Needs Python 3.13 (MONGOECO_PYTHON, else python3.13 on PATH, else pyenv's 3.13.x). The venv
# is cached in ${WORLD_CI_CACHE:-$HOME/.cache/world-ci}/mongoeco-venv and reused.
#
# stdout: KEY=VALUE lines only (WORLD_TEST_MONGO_URL=...); logs go to stderr.
# Writes <statedir>/mongoeco.pid and <statedir>/mongoeco.log. Stop: kill "$(cat <statedir>/mongoeco.pid)".
set -euo pipefail

log() { echo "mongo.sh: $*" >&2; }

statedir=${1:?usage: mongo.sh <statedir>}
mkdir -p "$statedir"
statedir=$(cd "$statedir" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${WORLD_CI_CACHE:-$HOME/.cache/world-ci}
venv="$cache/mongoeco-venv"
requirement='mongoeco[wire]>=4.11,<5'

is_313() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' >/dev/null 2>&1; }

find_python() {
    local candidate root
    if [[ -n ${MONGOECO_PYTHON:-} ]]; then echo "$MONGOECO_PYTHON"; return; fi
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    # pyenv's own interpreters first: its python3.13 shim on PATH may refuse to run.
    for candidate in $(ls -d "$root"/versions/3.13.*/bin/python 2>/dev/null | sort -rV) \
        $(command -v python3.13 || true); do
        if is_313 "$candidate"; then echo "$candidate"; return; fi
    done
    return 1
}

if ! "$venv/bin/python" -c 'import mongoeco.wire, pymongo' >/dev/null 2>&1; then
    py=$(find_python) || { log "no Python 3.13 found (set MONGOECO_PYTHON)"; exit 1; }
    log "creating $venv with $py"
    rm -rf "$venv"
    mkdir -p "$cache"
    "$py" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$requirement" >&2
fi

port=$("$venv/bin/python" - <<'EOF'
import socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1])
EOF
)

nohup "$venv/bin/python" "$here/mongoeco_server.py" --host 127.0.0.1 --port "$port" \
    >"$statedir/mongoeco.log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$statedir/mongoeco.pid"
log "mongoeco pid $pid on 127.0.0.1:$port (log: $statedir/mongoeco.log)"

url="mongodb://127.0.0.1:$port"
if ! "$venv/bin/python" - "$url" "$pid" <<'EOF' >&2
import os, sys, time
from pymongo import MongoClient
from pymongo.errors import PyMongoError
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("mongoeco exited before answering")
    try:
        with MongoClient(url, serverSelectionTimeoutMS=1000) as client:
            client.admin.command("ping")
        sys.exit(0)
    except PyMongoError:
        time.sleep(0.2)
sys.exit("mongoeco did not answer a ping within 60 s")
EOF
then
    log "server failed to start; its log follows"
    cat "$statedir/mongoeco.log" >&2 || true
    kill "$pid" 2>/dev/null || true
    exit 1
fi

echo "WORLD_TEST_MONGO_URL=$url"
