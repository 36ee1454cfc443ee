printf '%*s|\n' 6 hi
printf '%-*s|\n' 6 hi
