printf '1\n2\nmatch\n4\n5\n' | grep -A1 -B1 match
