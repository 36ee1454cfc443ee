# compare: stderr
die() { echo "fatal: $1" >&2; exit 2; }
echo start
die broken
