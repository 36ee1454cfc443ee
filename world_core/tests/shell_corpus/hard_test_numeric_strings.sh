[ 10 -gt 9 ] && echo numeric
[[ 10 > 9 ]] || echo lexical
