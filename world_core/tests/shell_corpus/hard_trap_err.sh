trap 'echo "error on line"' ERR
false
echo after
