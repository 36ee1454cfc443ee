printf 'x 3\ny 1\nz 2\n' | sort -k2 -n
