printf '3\n1\n2\n' | awk '{a[NR]=$1} END {for (i=NR; i>0; i--) printf "%d%s", a[i], (i>1?",":"\n")}'
