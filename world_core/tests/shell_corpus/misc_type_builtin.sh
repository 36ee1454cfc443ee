type echo | head -c 4
echo
