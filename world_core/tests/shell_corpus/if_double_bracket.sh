s=hello.txt
[[ $s == *.txt ]] && echo glob-match
[[ $s =~ ^h(el+)o ]] && echo "regex ${BASH_REMATCH[1]}"
[[ -n $s && $s != x ]] && echo both
