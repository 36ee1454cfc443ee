awk -v n=3 'BEGIN {for (i = 1; i <= n; i++) print i * i}'
