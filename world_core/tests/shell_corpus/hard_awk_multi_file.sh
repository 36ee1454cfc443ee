printf 'k1 v1\nk2 v2\n' > map
printf 'k2\nk1\nk3\n' > keys
awk 'NR==FNR {m[$1]=$2; next} {print $1, ($1 in m ? m[$1] : "none")}' map keys
