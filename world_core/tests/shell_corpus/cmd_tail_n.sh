printf '1\n2\n3\n4\n5\n' > f
tail -n 2 f
tail -n +4 f
