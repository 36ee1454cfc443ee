printf '10\n9\n100\n1\n' | sort -n
