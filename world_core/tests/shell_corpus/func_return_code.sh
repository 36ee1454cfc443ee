check() { [ "$1" -gt 10 ]; }
check 5 || echo "5 not > 10"
check 20 && echo "20 > 10"
