unset x
echo "${x:-default}"
x=""
echo "[${x:-empty-default}] [${x-unset-only}]"
