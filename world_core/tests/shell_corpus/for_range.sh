for i in {1..5}; do echo -n "$i"; done
echo
