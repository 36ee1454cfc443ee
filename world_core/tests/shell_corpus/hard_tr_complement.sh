echo 'a1b2c3' | tr -cd '0-9'
echo
