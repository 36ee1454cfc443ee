# compare: stderr
warn() { echo "warning: $*" >&2; }
warn disk low
echo ok
