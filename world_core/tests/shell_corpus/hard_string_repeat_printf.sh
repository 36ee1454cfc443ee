printf -- '-%.0s' {1..5}
echo
