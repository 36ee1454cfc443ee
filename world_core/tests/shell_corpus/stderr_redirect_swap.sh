# compare: stderr
{ echo A; echo B >&2; } 2>&1 1>/dev/null
