printf '10\n20\n30\n' | awk '{s += $1} END {print s}'
