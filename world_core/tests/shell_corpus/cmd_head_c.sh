echo abcdefgh | head -c 3
echo
