seq 3
seq 2 2 8
