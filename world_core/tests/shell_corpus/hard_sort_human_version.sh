printf '1.10\n1.2\n1.9\n' | sort -V
