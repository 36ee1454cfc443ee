trap 'echo cleanup' EXIT
echo working
