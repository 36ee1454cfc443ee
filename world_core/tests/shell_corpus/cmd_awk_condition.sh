printf 'x 5\ny 15\nz 25\n' | awk '$2 > 10 {print $1}'
