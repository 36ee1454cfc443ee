printf 'a\nb\na\nc\na\n' | awk '{c[$1]++} END {for (k in c) print k, c[k]}' | sort
