seq 1 20 | tail -n 4
