seq 1 1000 | head -n 3
