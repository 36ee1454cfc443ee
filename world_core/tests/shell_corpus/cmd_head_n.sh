printf '1\n2\n3\n4\n5\n' > f
head -n 2 f
head -2 f
